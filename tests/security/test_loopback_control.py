"""``insecure_loopback_control`` admits a direct loopback client only, under a real uvicorn and
in-process for each proxy header.

uvicorn's proxy-header support (``FORWARDED_ALLOW_IPS='*'``) rewrites ``scope["client"]`` from
``X-Forwarded-For``; a client bound to 127.0.0.2 must not pass for 127.0.0.1 that way, and a
request whose ``Host`` is not a loopback name (a browser page after DNS rebinding) must not
pass either.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from forgezero_lifecycle.runtime import Runtime
from tests.real_servers._servers import RunningServer, start_server, stop_server
from tests.security._asgi import call, inner_app

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


# In-process, at the message level: every header a reverse proxy adds by default.

PROXY_HEADERS = [
    ("via", "1.1 nginx"),
    ("forwarded", "for=127.0.0.1;proto=http"),
    ("x-forwarded-for", "127.0.0.1"),
    ("x-forwarded-proto", "http"),
    ("x-forwarded-host", "localhost"),
    ("x-forwarded-port", "80"),
    ("x-real-ip", "127.0.0.1"),
    ("X-Forwarded-Proto", "https"),
]


async def _loopback_status(headers: list[tuple[bytes, bytes]]) -> tuple[int, Any]:
    app = Runtime(insecure_loopback_control=True).wrap(inner_app)
    path, _, query = STATUS.partition("?")
    answer = await call(
        app,
        method="GET",
        path=path,
        raw_path=path.encode("ascii"),
        query_string=query.encode("ascii"),
        headers=[(b"host", b"127.0.0.1:8000"), *headers],
    )
    return answer.status, answer.json()


@pytest.mark.anyio
async def test_direct_loopback_admitted_in_process() -> None:
    """A loopback peer naming a loopback Host, with no proxy header, reaches the handler."""
    status, body = await _loopback_status([])
    assert (status, body["error"]) == (404, "RUNTIME_DRAIN_NOT_FOUND")


@pytest.mark.anyio
@pytest.mark.parametrize(("name", "value"), PROXY_HEADERS)
async def test_proxied_request_refused(name: str, value: str) -> None:
    """A request a proxy on this host relayed (nginx's default ``proxy_pass`` to 127.0.0.1 adds
    ``Via`` or ``X-Forwarded-Proto``) is not a loopback client: 401 ``RUNTIME_UNAUTHORIZED``."""
    status, body = await _loopback_status([(name.encode("latin-1"), value.encode("latin-1"))])
    assert (status, body["error"]) == (401, "RUNTIME_UNAUTHORIZED")
    assert "proxied" in body["detail"]
