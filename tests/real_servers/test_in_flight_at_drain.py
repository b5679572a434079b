"""Requests a drain finds already running, over real sockets, under every server kind.

The in-flight middleware hands such a request the server's own ``receive`` and ``send`` under
uvicorn (and ``forgezero-lifecycle serve``) and hypercorn (HTTP/1), and acts on the server's
request cycle or stream when the drain begins; under any other server it wraps them. Either way the request must see the drain: a
response it starts during the drain carries Connection: close, a ``receive()`` after its body
returns ``http.disconnect`` once the stream grace is over, and an answer it sends without waiting
on ``receive()`` arrives whole. Under serve a response that started before the drain closes its
connection after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import h11
import httpx
import pytest

from forgezero_lifecycle.core._httpx import tls_context

from ._control import STREAM_GRACE, WireControl
from ._servers import SERVE_KINDS, SERVER_KINDS, RunningServer
from .conftest import run_test_app

pytestmark = [pytest.mark.server, pytest.mark.anyio]

#: The server kinds whose requests reach the app unwrapped, and the class of the server's own
#: object behind the ``send`` the app is handed (uvicorn's request cycle, hypercorn's stream).
UNWRAPPED: dict[str, str] = {
    "uvicorn-h11": "RequestResponseCycle",
    "uvicorn-httptools": "RequestResponseCycle",
    "serve-h11": "RequestResponseCycle",
    "serve-httptools": "RequestResponseCycle",
    "hypercorn": "HTTPStream",
}
#: Past the stream grace, so the notice comes while the request is still running.
PAST_GRACE = STREAM_GRACE + 0.7


@pytest.fixture(scope="module", params=SERVER_KINDS + SERVE_KINDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """This module's app under one real server (the ``http`` and ``control`` fixtures use it)."""
    yield from run_test_app(request.param, "tests.real_servers.in_flight_app:app", tmp_path_factory)


def _owner_is_expected(server: RunningServer, owner: str) -> bool:
    """The unwrapped path is taken exactly where expected: a lost fast path fails here too."""
    return owner == UNWRAPPED.get(server.kind, "_HttpResponder")


async def test_answer_across_notice(
    server: RunningServer, http: httpx.AsyncClient, control: WireControl
) -> None:
    """A request that read its body and works past the stream grace is not told to stop: its
    answer, started during the drain, arrives whole and carries Connection: close."""
    pending = asyncio.create_task(
        http.post("/respond-later", params={"seconds": PAST_GRACE}, content=b"payload")
    )
    await control.wait_admitted("http")
    nonce = await control.begin()
    response = await pending

    assert response.status_code == 200
    assert response.content == b"payload"
    assert response.headers["connection"] == "close"
    assert _owner_is_expected(server, response.headers["x-send-owner"])
    assert (await control.wait_for_status(nonce, "drained", "failed"))["status"] == "drained"


async def test_late_receive_disconnects(
    server: RunningServer, http: httpx.AsyncClient, control: WireControl
) -> None:
    """A stream that was not waiting on receive() at the notice still gets http.disconnect from
    its next receive(). The response never ends cleanly without the app's last part: uvicorn
    drops a send made after a disconnect, so there the response is cut (no terminating chunk,
    httpx raises); hypercorn sends the app's last part, which ends it cleanly."""
    before = len((await http.get("/_test/seen")).json())
    # A client of its own: the server closes this connection after the response, which started
    # too early to say so, and a pooled client could send its next request into that close.
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=10.0, verify=tls_context()) as streaming,
        streaming.stream("GET", "/receive-later", params={"seconds": PAST_GRACE}) as response,
    ):
        lines = response.aiter_lines()
        assert await anext(lines) == "first"
        nonce = await control.begin()
        if server.kind == "hypercorn":
            assert [line async for line in lines] == ["http.disconnect"]
        else:
            with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
                await _rest(lines)

    assert (await http.get("/_test/seen")).json()[before:] == ["http.disconnect"]
    assert _owner_is_expected(server, response.headers["x-send-owner"])
    assert (await control.wait_for_status(nonce, "drained", "failed"))["status"] == "drained"


async def test_started_response_whole(server: RunningServer, control: WireControl) -> None:
    """A response started before the drain is answered whole, then closed or told to close: it can
    no longer carry Connection: close. serve closes the connection after it; any other server keeps
    it (documented), and the next request sent on it is answered and told to close."""
    host, port = server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        client = h11.Connection(h11.CLIENT)
        target = "/started?seconds=0.3"
        writer.write(
            client.send(h11.Request(method="GET", target=target, headers=[("Host", host)]))
        )
        writer.write(client.send(h11.EndOfMessage()))
        await writer.drain()
        head = await _next_event(client, reader)
        assert isinstance(head, h11.Response)
        assert (b"connection", b"close") not in head.headers
        await control.begin()
        while not isinstance(await _next_event(client, reader), h11.EndOfMessage):
            pass
        if server.kind in SERVE_KINDS:
            assert await asyncio.wait_for(reader.read(), timeout=5.0) == b""
            return
        client.start_next_cycle()
        again = h11.Request(method="GET", target="/started?seconds=0", headers=[("Host", host)])
        writer.write(client.send(again) + client.send(h11.EndOfMessage()))
        await writer.drain()
        answer = await _next_event(client, reader)
        assert isinstance(answer, h11.Response)
        assert answer.status_code in (200, 503)  # admitted in the not-ready grace, or refused
        assert (b"connection", b"close") in answer.headers
    finally:
        writer.close()
        await writer.wait_closed()


async def _next_event(client: h11.Connection, reader: asyncio.StreamReader) -> object:
    while True:
        event = client.next_event()
        if event is not h11.NEED_DATA:
            return event
        client.receive_data(await asyncio.wait_for(reader.read(65536), timeout=5.0))


async def _rest(lines: AsyncIterator[str]) -> list[str]:
    return [line async for line in lines]
