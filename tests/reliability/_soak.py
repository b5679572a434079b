"""CI form or soak form: ``FORGEZERO_SOAK=1`` switches every reliability and security test to
more rounds, more requests and more generated inputs.

``FORGEZERO_RELIABILITY_REPORT=PATH`` appends one JSON line per scenario run (the counts that
RELIABILITY.md quotes); without it the counts are only printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Final, TypeVar

__all__ = ["SOAK", "report", "scale"]

SOAK: Final = os.environ.get("FORGEZERO_SOAK") == "1"

T = TypeVar("T")


def scale(ci: T, soak: T) -> T:
    """``soak`` in the soak form, ``ci`` otherwise."""
    return soak if SOAK else ci


def report(scenario: str, **counts: Any) -> None:
    """Record the counts of one scenario run (printed, and appended to the report file)."""
    line = {"scenario": scenario, "soak": SOAK, "at": time.strftime("%Y-%m-%dT%H:%M:%S"), **counts}
    text = json.dumps(line, sort_keys=True)
    print(text)
    path = os.environ.get("FORGEZERO_RELIABILITY_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(text + "\n")
