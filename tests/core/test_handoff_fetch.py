"""The handoff fetch pays no import inside a handoff's deadline."""

from __future__ import annotations

import ast
import socket
import subprocess
import sys

_SCRIPT = """
import asyncio, sys
from forgezero_lifecycle._errors import StateTransferFailedError
from forgezero_lifecycle.core import _fetch

async def main() -> None:
    transport = _fetch.loopback_transport()
    before = set(sys.modules)
    try:
        await _fetch.fetch_document(
            "http://127.0.0.1:{port}/x", "Bearer " + "t" * 43, transport=transport, limit=100
        )
    except StateTransferFailedError as refused:
        assert refused.code == "RUNTIME_STATE_SOURCE_UNREACHABLE", refused.code
    print(sorted(set(sys.modules) - before))

asyncio.run(main())
"""


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_first_fetch_imports_nothing() -> None:
    """A fresh process (a new generation) loads what a fetch needs when it builds the transport,
    at start-up, so the first handoff never waits for an import (anyio's backend: ~20 ms)."""
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(port=_closed_port())],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert ast.literal_eval(done.stdout.strip()) == []


_CLI_SCRIPT = """
import sys
from forgezero_lifecycle.core import _fetch
print("rich" in sys.modules, "httpx._main" in sys.modules)
import httpx._main
print("rich" in sys.modules)
"""


def test_fetch_skips_httpx_cli() -> None:
    """httpx's CLI (rich and pygments, installed here by the dev tools) is not loaded by the
    fetch, and ``import httpx._main`` still works afterwards."""
    done = subprocess.run(
        [sys.executable, "-c", _CLI_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "True"]
