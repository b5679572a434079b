"""A ``localhost`` handoff source is connected as a loopback literal, never through the resolver.

The resolver is made to answer 127.0.0.2 for ``localhost`` (as a hostile ``/etc/hosts`` could);
a server listening there must never see the request or its token.
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from forgezero_lifecycle.core._fetch import fetch_document, loopback_transport

pytestmark = pytest.mark.anyio

AUTH = "Bearer " + "T" * 43


class Recorder:
    """A loopback HTTP server that answers ``{}`` and records each request's headers."""

    def __init__(self, address: str, port: int = 0) -> None:
        self.seen: list[dict[str, str]] = []
        seen = self.seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(dict(self.headers.items()))
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((address, port), Handler)
        self.port: int = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def rogue() -> Iterator[Recorder]:
    server = Recorder("127.0.0.2")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def localhost_resolves_to_rogue(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo

    def lying(host: Any, *args: Any, **kwargs: Any) -> Any:
        return real("127.0.0.2" if host in ("localhost", b"localhost") else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lying)


@pytest.mark.usefixtures("localhost_resolves_to_rogue")
async def test_localhost_is_127_0_0_1(rogue: Recorder) -> None:
    """The request (and token) reach 127.0.0.1 with Host: localhost; 127.0.0.2 sees nothing."""
    honest = Recorder("127.0.0.1", rogue.port)
    try:
        url = f"http://localhost:{rogue.port}/export"
        document = await fetch_document(url, AUTH, transport=loopback_transport(), limit=1000)
    finally:
        honest.close()
    assert document == {}
    assert rogue.seen == []
    (headers,) = honest.seen
    assert headers["Host"] == f"localhost:{rogue.port}"
    assert headers["Authorization"] == AUTH


@pytest.mark.usefixtures("localhost_resolves_to_rogue")
async def test_no_loopback_listener_fails(
    rogue: Recorder,
) -> None:
    """With no listener on 127.0.0.1 or [::1] the fetch fails; the token never leaves."""
    from forgezero_lifecycle._errors import StateTransferFailedError

    url = f"http://localhost:{rogue.port}/export"
    with pytest.raises(StateTransferFailedError) as caught:
        await fetch_document(url, AUTH, transport=loopback_transport(), limit=1000)
    assert caught.value.code == "RUNTIME_STATE_SOURCE_UNREACHABLE"
    assert rogue.seen == []
