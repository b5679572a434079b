"""WebSockets across a drain, over real sockets, under every server kind."""

from __future__ import annotations

import asyncio

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from ._control import WireControl
from ._servers import RunningServer

pytestmark = [pytest.mark.server, pytest.mark.anyio]


async def test_open_websocket_1012(server: RunningServer, control: WireControl) -> None:
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


async def test_new_websocket_503(server: RunningServer, control: WireControl) -> None:
    """A new WebSocket handshake is refused with 503 while draining: every server here offers
    websocket.http.response, so the refusal is an HTTP 503 denial."""
    await control.begin()

    with pytest.raises(InvalidStatus) as refused:
        async with connect(server.ws_url + "/ws", open_timeout=5):
            pass

    response = refused.value.response
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.body == b'{"error":"RUNTIME_DRAINING"}'


async def test_push_only_websocket_ends(server: RunningServer, control: WireControl) -> None:
    """A handler that only sends and never calls receive() learns of the close 1012 from its
    next send (Starlette: WebSocketDisconnect), ends, and the drain reaches drained."""
    async with connect(server.ws_url + "/ws/push", open_timeout=5, close_timeout=5) as websocket:
        assert await websocket.recv() == "tick"
        await control.wait_admitted("websocket")
        nonce = await control.begin(timeout_ms=3000)

        with pytest.raises(ConnectionClosed) as closed:
            await _read_until_closed(websocket)

    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1012
    status = await control.wait_for_status(nonce, "drained", "failed")
    assert status["status"] == "drained"
    assert status["inFlight"]["websocket"] == 0


async def test_two_part_denial_whole(server: RunningServer, control: WireControl) -> None:
    """An app's denial response sent as two websocket.http.response.body parts is not cut after
    the first; the session is counted out, so a drain reaches drained."""
    with pytest.raises(InvalidStatus) as denied:
        async with connect(server.ws_url + "/ws/deny", open_timeout=5):
            pass

    response = denied.value.response
    assert response.status_code == 403
    assert response.body == b"denied, in two parts"
    nonce = await control.begin()
    status = await control.wait_for_status(nonce, "drained", "failed")
    assert status["status"] == "drained"
    assert status["inFlight"]["websocket"] == 0


async def _read_until_closed(websocket: ClientConnection) -> None:
    """Read messages until the connection closes (raises ConnectionClosed); bounded."""
    async with asyncio.timeout(10):
        while True:
            await websocket.recv()
