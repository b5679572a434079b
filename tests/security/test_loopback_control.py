"""``insecure_loopback_control`` admits a direct loopback client only, under a real uvicorn.

uvicorn's proxy-header support (``FORWARDED_ALLOW_IPS='*'``) rewrites ``scope["client"]`` from
``X-Forwarded-For``; a client bound to 127.0.0.2 must not pass for 127.0.0.1 that way, and a
request whose ``Host`` is not a loopback name (a browser page after DNS rebinding) must not
pass either.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.real_servers._servers import RunningServer, start_server, stop_server

pytestmark = pytest.mark.server

STATUS = "/.forgezero/runtime/drain/v1/status?nonce=" + "N" * 43


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    running = start_server(
        "uvicorn-h11",
        "tests.security.loopback_app:app",
        log_path=tmp_path / "uvicorn.log",
        environment={"FORWARDED_ALLOW_IPS": "*"},
    )
    try:
        yield running
    finally:
        stop_server(running)


def get(server: RunningServer, *, source: str, headers: dict[str, str] | None = None) -> int:
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, trust_env=False, timeout=10) as client:
        return client.get(server.url + STATUS, headers=headers).status_code


def test_direct_loopback_admitted(server: RunningServer) -> None:
    """The baseline: 127.0.0.1 with a loopback Host reaches the handler (404: no such drain)."""
    assert get(server, source="127.0.0.1") == 404


def test_forwarded_for_ignored(server: RunningServer) -> None:
    """127.0.0.2 claiming X-Forwarded-For: 127.0.0.1 (or Forwarded) is refused."""
    assert get(server, source="127.0.0.2") == 401
    assert get(server, source="127.0.0.2", headers={"X-Forwarded-For": "127.0.0.1"}) == 401
    assert get(server, source="127.0.0.1", headers={"X-Forwarded-For": "127.0.0.1"}) == 401
    assert get(server, source="127.0.0.1", headers={"Forwarded": "for=127.0.0.1"}) == 401


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8000", "127.0.0.1.nip.io"])
def test_non_loopback_host_refused(server: RunningServer, host: str) -> None:
    """A rebound DNS name reaches a loopback socket, but its Host gives it away."""
    assert get(server, source="127.0.0.1", headers={"Host": host}) == 401
