"""A runtime in ``insecure_loopback_control`` mode (no token), for the real-server tests."""

from __future__ import annotations

from forgezero_lifecycle.runtime import Runtime
from tests.security._asgi import inner_app

runtime = Runtime(insecure_loopback_control=True)
app = runtime.wrap(inner_app)
