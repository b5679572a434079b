"""WebSockets across a drain, over real sockets, under every server kind."""

from __future__ import annotations

import asyncio

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from ._control import ControlClient
from ._servers import RunningServer

pytestmark = [pytest.mark.server, pytest.mark.anyio]


async def test_open_websocket_is_closed_with_1012_after_the_stream_grace(
    server: RunningServer, control: ControlClient
) -> None:
    """An open session gets close code 1012, reason "draining", once the stream grace is over."""
    async with connect(server.ws_url + "/ws", open_timeout=5, close_timeout=5) as websocket:
        await websocket.send("hello")
        assert await websocket.recv() == "hello"
        nonce = await control.begin()

        with pytest.raises(ConnectionClosed) as closed:
            async with asyncio.timeout(10):
                await websocket.recv()

    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1012
    assert closed.value.rcvd.reason == "draining"
    status = await control.wait_for_status(nonce, "drained", "failed")
    assert status["status"] == "drained"
    assert status["inFlight"]["websocket"] == 0


async def test_new_websocket_handshake_is_refused_with_503_while_draining(
    server: RunningServer, control: ControlClient
) -> None:
    """Every server here offers websocket.http.response, so the refusal is an HTTP 503 denial."""
    await control.begin()

    with pytest.raises(InvalidStatus) as refused:
        async with connect(server.ws_url + "/ws", open_timeout=5):
            pass

    response = refused.value.response
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.body == b'{"error":"RUNTIME_DRAINING"}'
