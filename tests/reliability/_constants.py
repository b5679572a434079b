"""Constants the reliability app (in its server process) and the tests (in theirs) share."""

from __future__ import annotations

from typing import Final

__all__ = ["HANDOFF_TOKEN", "STATE_MAXIMUM_BYTES", "STATE_PROTOCOL"]

STATE_PROTOCOL: Final = "tests.reliability.served"
#: Small on purpose: the hostile-source tests count bytes against it (plus 4 KiB of slack).
STATE_MAXIMUM_BYTES: Final = 1024
#: The handoff token: 43 base64url characters, the only form a handoff request accepts.
HANDOFF_TOKEN: Final = "reliability-handoff-token-0123456789abcdefg"
