"""Streaming responses across a drain, over real sockets, under every server kind.

The test app's stream never looks at the drain itself: what ends it is the middleware's
``http.disconnect`` after the stream grace, which Starlette's ``StreamingResponse`` listens for
(every server here announces ASGI spec 2.3 or older for HTTP, so Starlette runs its disconnect
listener), and the middleware then cuts the response the app left unfinished so that the client
can tell: the connection ends without the terminating chunk, or short of its Content-Length.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import httpx
import pytest

from ._control import WireControl
from ._servers import RunningServer
from .conftest import ServerLog

pytestmark = [pytest.mark.server, pytest.mark.anyio]


async def test_stream_within_grace(http: httpx.AsyncClient, control: WireControl) -> None:
    """A stream admitted before the drain that ends within the stream grace delivers every chunk and
    ends cleanly."""
    async with http.stream("GET", "/stream", params={"chunks": 4, "interval": 0.03}) as response:
        chunks = response.aiter_lines()
        first = await anext(chunks)
        nonce = await control.begin()
        rest = [line async for line in chunks]

    assert response.status_code == 200
    assert [first, *rest] == [f"chunk {index}" for index in range(4)]
    status = await control.wait_for_status(nonce, "drained", "failed")
    assert status["status"] == "drained"


async def test_stream_past_grace_ended(http: httpx.AsyncClient, control: WireControl) -> None:
    """After the stream grace a long chunked stream the drain ends is cut so the client can
    tell: the connection ends without the terminating chunk (httpx raises), never cleanly."""
    lines: list[str] = []
    async with http.stream("GET", "/stream", params={"chunks": 200, "interval": 0.05}) as response:
        chunks = response.aiter_lines()
        lines.append(await anext(chunks))
        nonce = await control.begin()
        with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
            await _rest(chunks, into=lines)

    assert response.status_code == 200
    assert response.headers["transfer-encoding"] == "chunked"
    assert 1 <= len(lines) < 200
    assert lines == [f"chunk {index}" for index in range(len(lines))]
    status = await control.wait_for_status(nonce, "drained", "failed")
    assert status["status"] == "drained"
    assert status["inFlight"]["http"] == 0


async def test_sized_stream_cut_cleanly(
    http: httpx.AsyncClient, control: WireControl, server_log: ServerLog
) -> None:
    """A stream with a declared Content-Length that the drain ends is cut short of its length:
    the client sees the body incomplete, and no exception escapes into the server."""
    async with http.stream(
        "GET", "/stream", params={"chunks": 200, "interval": 0.05, "length": 1}
    ) as response:
        chunks = response.aiter_lines()
        await anext(chunks)
        nonce = await control.begin()
        with pytest.raises(httpx.RemoteProtocolError):  # the body is shorter than declared
            await _rest(chunks)

    assert (await control.wait_for_status(nonce, "drained", "failed"))["status"] == "drained"
    log = server_log.take()
    assert "Traceback" not in log, log


async def test_non_reader_cannot_stall(
    server: RunningServer, control: WireControl, server_log: ServerLog
) -> None:
    """A client that requests an endless stream and never reads blocks the server's sends; at
    the drain's release margin the connection is given up, so the drain ends drained within its
    deadline, and a later drain after rollback is not stuck behind it."""
    with _client_that_never_reads(server, "/flood"):
        await control.wait_admitted("http")
        nonce = await control.begin(timeout_ms=2000)
        status = await control.wait_for_status(nonce, "drained", "failed")
        assert status["status"] == "drained"
        assert status["inFlight"]["http"] == 0

        assert (await control.rollback(nonce)).status_code == 200
        again = await control.begin(timeout_ms=2000)
        status = await control.wait_for_status(again, "drained", "failed")
        assert status["status"] == "drained"
        assert status["inFlight"]["http"] == 0

    log = server_log.take()
    assert "Traceback" not in log, log
    # Ended once: at the notice (its app stops on http.disconnect and the response is cut), or
    # at the cutoff if its send was still blocked then.
    ended = log.count("drain.response_cut kind=http") + log.count(
        "drain.connection_abandoned kind=http"
    )
    assert ended == 1, log


@contextmanager
def _client_that_never_reads(server: RunningServer, path: str) -> Iterator[socket.socket]:
    """A raw loopback connection that sends one request and then reads nothing at all.

    Its small receive buffer (set before connecting, so the TCP window stays small) makes the
    server's sends block in flow control soon after the stream starts.
    """
    host, port = server.url.removeprefix("http://").split(":")
    client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.settimeout(5)
        client.connect((host, int(port)))
        client.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        yield client
    finally:
        client.close()  # unread data is pending: the kernel resets the connection


async def _rest(lines: AsyncIterator[str], into: list[str] | None = None) -> list[str]:
    """Every line left (added to ``into`` as they come, so a cut leaves what arrived)."""
    into = [] if into is None else into
    async for line in lines:
        into.append(line)  # kept line by line: a cut raises midway
    return into
