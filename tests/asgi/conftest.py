"""Fixtures of the ASGI tests: ``hypercorn``, a real hypercorn server in the test's event loop."""

from __future__ import annotations

from tests.asgi._hypercorn_server import hypercorn as hypercorn
