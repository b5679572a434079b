"""The stream notice's spread: WebSockets (and streams) told at their own instants, not at once.

``Runtime(stream_notice_spread=S)`` hands the middleware a window of S seconds (at most half of
what is left until the cutoff): at the notice, every session and request running is given its
own instant, evenly over it, the first at once. The cutoff bounds it: whoever is not told by
then is told at the cutoff. 0 tells every one at once, as before the setting existed.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from forgezero_lifecycle import ConfigurationError
from forgezero_lifecycle.asgi.middleware import InFlightMiddleware
from forgezero_lifecycle.core.gate import IntakeGate
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.testing import ASGIRecorder, settle
from tests.asgi.test_uvicorn_path import Transport

pytestmark = pytest.mark.anyio

TOKEN = "notice-spread-token-0123456789"
SESSIONS = 5
Message = dict[str, Any]
CLOSE_1012 = {"type": "websocket.close", "code": 1012, "reason": "draining"}


@pytest.mark.parametrize("spread", [-0.5, math.nan, math.inf, True, "1", 3601.0])
def test_unusable_spread_refused(spread: Any) -> None:
    """A spread the drain cannot use is refused when the runtime is built."""
    with pytest.raises(ConfigurationError, match="stream_notice_spread") as raised:
        Runtime(control_token=TOKEN, stream_notice_spread=spread)
    assert raised.value.code == "RUNTIME_CONFIG_INVALID"


def test_spread_reaches_middleware() -> None:
    """The spread reaches the middleware."""
    runtime = Runtime(control_token=TOKEN, stream_notice_spread=2.5, drain_on_signal=False)
    assert runtime._middleware_options()["notice_spread"] == 2.5
    assert Runtime(control_token=TOKEN)._middleware_options()["notice_spread"] == 2.0


async def _open_sessions(
    middleware: InFlightMiddleware,
) -> tuple[list[ASGIRecorder], list[asyncio.Future[None]]]:
    """SESSIONS WebSockets whose app only waits (and ends once its session is closed)."""
    recorders: list[ASGIRecorder] = []
    calls: list[asyncio.Future[None]] = []
    for _ in range(SESSIONS):
        recorder = ASGIRecorder({"type": "websocket.connect"})
        scope = {"type": "websocket", "path": "/ws", "root_path": "", "extensions": {}}
        recorders.append(recorder)
        calls.append(asyncio.ensure_future(middleware(scope, recorder.receive, recorder.send)))
    await settle()
    return recorders, calls


def _closed(recorders: list[ASGIRecorder]) -> int:
    return sum(CLOSE_1012 in recorder.sent for recorder in recorders)


async def waiting_app(scope: Message, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "websocket.accept"})
    await receive()  # the recorder's script is over: waits until the test ends it


async def test_no_spread_closes_at_notice() -> None:
    """Without a spread every session is closed at the notice."""
    gate = IntakeGate()
    recorders, calls = await _open_sessions(InFlightMiddleware(waiting_app, gate=gate))
    gate.close()
    gate.end_streams()
    await settle()
    assert _closed(recorders) == SESSIONS
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)


async def test_spread_closes_each_apart() -> None:
    """A window of an hour: the first session is closed at the notice, the others wait their
    instants, and the cutoff closes (not abandons) every one still waiting."""
    gate = IntakeGate()
    middleware = InFlightMiddleware(waiting_app, gate=gate, notice_spread=3600.0)
    recorders, calls = await _open_sessions(middleware)
    gate.close()
    gate.end_streams()
    await settle()
    assert _closed(recorders) == 1
    gate.cut_off()
    await settle()
    assert _closed(recorders) == SESSIONS
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)


async def test_window_at_most_half() -> None:
    """The runtime's room (seconds until the cutoff) caps the window: 4 s of room, 2 s of
    window, 5 sessions: instants 0, 0.4, 0.8, 1.2, 1.6 s."""
    gate = IntakeGate()
    middleware = InFlightMiddleware(
        waiting_app, gate=gate, notice_spread=60.0, notice_room=lambda: 4.0
    )
    _, calls = await _open_sessions(middleware)
    gate.close()
    gate.end_streams()
    delays = sorted(session.notice_delay for session in middleware._sessions)
    assert delays == pytest.approx([0.0, 0.4, 0.8, 1.2, 1.6])
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)


async def test_streams_spread_too() -> None:
    """Streaming requests waiting in receive() after their body (wrapped: admitted while
    draining): with an hour's spread one is told http.disconnect at the notice, the others at
    the cutoff."""
    gate = IntakeGate()
    gate.begin_draining()  # admitted while draining: the wrapped path
    told: list[int] = []

    async def streaming(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        if (await receive())["type"] == "http.disconnect":
            told.append(int(scope["path"].removeprefix("/s")))

    middleware = InFlightMiddleware(streaming, gate=gate, notice_spread=3600.0)
    calls = []
    for index in range(SESSIONS):
        recorder = ASGIRecorder({"type": "http.request", "body": b""})
        scope = {"type": "http", "path": f"/s{index}", "root_path": "", "method": "GET"}
        calls.append(asyncio.ensure_future(middleware(scope, recorder.receive, recorder.send)))
    await settle()
    gate.close()
    gate.end_streams()
    await settle()
    assert len(told) == 1
    gate.cut_off()
    await asyncio.wait_for(asyncio.gather(*calls), 5.0)
    assert sorted(told) == list(range(SESSIONS))


@pytest.mark.parametrize("http", ["h11", "httptools"])
async def test_uvicorn_streams_spread(http: str) -> None:
    """Under uvicorn's own request cycles (nothing wrapped, each fed by a real protocol object):
    with an hour's spread one stream is told http.disconnect at the notice, the others at the
    cutoff."""
    gate = IntakeGate()
    told: list[Message] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        told.append(await receive())

    middleware = InFlightMiddleware(app, gate=gate, notice_spread=3600.0)
    config = uvicorn.Config(middleware, http=http, lifespan="off", log_level="warning")
    config.load()
    # Held, as a server holds its connections (its transports do): the running requests are
    # counted through their connections' notices, kept weakly, and a protocol nothing refers to
    # is garbage, its request with it, whenever the collector runs (the suite's other tests made
    # it run here once).
    protocols = []
    for _ in range(SESSIONS):
        protocol = config.http_protocol_class(
            config=config, server_state=ServerState(), app_state={}
        )
        protocols.append(protocol)
        protocol.connection_made(Transport())
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
    await settle()
    assert gate.statistics().http == SESSIONS
    gate.close()
    gate.end_streams()
    await settle()
    assert told == [{"type": "http.disconnect"}]
    gate.cut_off()
    await settle()
    assert told == [{"type": "http.disconnect"}] * SESSIONS
    assert gate.statistics().http == 0
