"""The drain notice every handler can reach: ``scope["extensions"]["forgezero.drain"]``.

Message level and in process, under uvicorn's own protocol objects, hypercorn in this loop and
a server the middleware does not know (every request wrapped): ``wait()`` returns at the
request's instant of the stream notice (not when the drain begins), a handler that waits on it
is not ended by the middleware at that instant and finishes cleanly, and ``deadline`` says how
long is left until the cutoff.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest

from forgezero_lifecycle.asgi._notice import EXTENSION, DrainNotice
from forgezero_lifecycle.asgi.middleware import InFlightMiddleware
from forgezero_lifecycle.core.gate import IntakeGate
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.testing import ASGIRecorder, ManualClock, settle
from tests.asgi.test_uvicorn_path import GET
from tests.asgi.test_uvicorn_path import serve as serve
from tests.test_runtime import drain_request

pytestmark = pytest.mark.anyio

Message = dict[str, Any]
TOKEN = "drain-notice-token-0123456789"
LAST_EVENT = b"retry: 1000\nevent: draining\ndata: bye\n\n"


def http_scope(**extra: Any) -> Message:
    return {"type": "http", "method": "GET", "path": "/", "root_path": "", "headers": [], **extra}


def notice_of(scope: Message) -> DrainNotice:
    notice = scope["extensions"][EXTENSION]
    assert isinstance(notice, DrainNotice)
    return notice


def sse_app(told: list[str], started: asyncio.Event | None = None) -> Any:
    """A stream that ends itself when told: a last event, then the end of the body. It also
    waits on receive(), as Starlette's StreamingResponse does, which must not cut it."""

    async def app(scope: Message, receive: Any, send: Any) -> None:
        notice = notice_of(scope)
        await receive()  # the (empty) request body
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        if started is not None:
            started.set()
        disconnect = asyncio.ensure_future(receive())
        await asyncio.wait(
            (disconnect, asyncio.ensure_future(notice.wait())), return_when="FIRST_COMPLETED"
        )
        if disconnect.done():
            told.append(disconnect.result()["type"])
            return
        disconnect.cancel()
        told.append("notice")
        await send({"type": "http.response.body", "body": LAST_EVENT, "more_body": False})

    return app


async def test_notice_on_every_wrapped_scope() -> None:
    """Under a server the middleware does not know, HTTP and WebSocket scopes carry the notice,
    and a scope that has extensions keeps them (the notice is added, nothing copied)."""
    gate = IntakeGate()
    seen: list[Message] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        seen.append(scope)

    middleware = InFlightMiddleware(app, gate=gate)
    await middleware(http_scope(), ASGIRecorder().receive, ASGIRecorder().send)
    extensions: dict[str, object] = {"http.response.trailers": {}}
    await middleware(http_scope(extensions=extensions), ASGIRecorder().receive, ASGIRecorder().send)
    ws = {"type": "websocket", "path": "/ws", "root_path": "", "extensions": {}}
    await middleware(ws, ASGIRecorder({"type": "websocket.connect"}).receive, ASGIRecorder().send)
    assert all(isinstance(scope["extensions"][EXTENSION], DrainNotice) for scope in seen)
    assert len(seen) == 3
    assert seen[1]["extensions"] is extensions
    assert set(extensions) == {"http.response.trailers", EXTENSION}


async def test_wait_returns_at_notice_not_drain_begin() -> None:
    """wait() returns at the stream notice: not when readiness turns off, nor when intake
    closes, so a stream keeps going through the not-ready and stream graces."""
    gate = IntakeGate()
    app, scopes, release = holding()
    call = asyncio.ensure_future(InFlightMiddleware(app, gate=gate)(http_scope(), *_io()))
    await settle()
    waiting = asyncio.ensure_future(notice_of(scopes[0]).wait())
    gate.begin_draining()
    await settle()
    assert not waiting.done()
    gate.close()
    await settle()
    assert not waiting.done()
    gate.end_streams()
    await settle()
    assert waiting.done()
    await notice_of(scopes[0]).wait()  # its instant has passed: at once
    release.set()
    await call


def holding() -> tuple[Any, list[Message], asyncio.Event]:
    """An app that keeps each request running until released, and the scopes it was handed."""
    scopes: list[Message] = []
    release = asyncio.Event()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        scopes.append(scope)
        await release.wait()

    return app, scopes, release


def _io() -> tuple[Any, Any]:
    recorder = ASGIRecorder({"type": "http.request", "body": b""})
    return recorder.receive, recorder.send


async def test_waiting_stream_ends_cleanly_wrapped() -> None:
    """A wrapped stream whose handler waits on the notice gets no http.disconnect at it: it
    sends its last event and ends the body itself, cleanly."""
    gate = IntakeGate()
    told: list[str] = []
    recorder = ASGIRecorder({"type": "http.request", "body": b""})
    call = asyncio.ensure_future(
        InFlightMiddleware(sse_app(told), gate=gate)(http_scope(), recorder.receive, recorder.send)
    )
    await settle()
    gate.close()
    gate.end_streams()
    await call
    assert told == ["notice"]
    assert recorder.sent[-1] == {
        "type": "http.response.body",
        "body": LAST_EVENT,
        "more_body": False,
    }
    assert gate.statistics().http == 0


async def test_waiting_stream_ends_cleanly_uvicorn(serve: Any) -> None:
    """Under uvicorn (the request unwrapped, admitted while serving) the same: the handler is
    told through the notice alone and its chunked body ends with the terminating chunk."""
    gate = IntakeGate()
    told: list[str] = []
    started = asyncio.Event()
    _, transport = serve(InFlightMiddleware(sse_app(told, started), gate=gate), GET)
    await started.wait()
    await settle()
    gate.close()
    gate.end_streams()
    await settle()
    assert told == ["notice"]
    assert bytes(transport.written).endswith(b"\r\n0\r\n\r\n")
    assert LAST_EVENT in bytes(transport.written)
    assert not transport.aborted
    assert gate.statistics().http == 0


async def test_uvicorn_scope_gets_extensions(serve: Any) -> None:
    """uvicorn gives an HTTP scope no extensions: the middleware adds them, with the notice."""
    gate = IntakeGate()
    seen: list[Message] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        seen.append(scope)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    serve(InFlightMiddleware(app, gate=gate), GET)
    await settle()
    assert list(seen[0]["extensions"]) == [EXTENSION]
    assert notice_of(seen[0]).deadline is None


async def test_waiting_stream_ends_cleanly_hypercorn(hypercorn: Any) -> None:
    """Under hypercorn (HTTP/1, unwrapped) the same: the handler's last event arrives and the
    body ends cleanly."""
    gate = IntakeGate()
    told: list[str] = []
    started = asyncio.Event()
    served = await hypercorn(InFlightMiddleware(sse_app(told, started), gate=gate))
    client = await served.connect()
    await client.request()
    await client.head()
    await started.wait()
    await settle()
    gate.close()
    gate.end_streams()
    assert await client.rest() == b"data: 1\n\n" + LAST_EVENT
    assert told == ["notice"]


async def test_waiting_stream_cut_at_cutoff_if_not_ended() -> None:
    """A handler that waits on the notice but does not end is told http.disconnect at the
    cutoff, as every other stream is."""
    gate = IntakeGate()
    got: list[str] = []
    listening: list[asyncio.Future[None]] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        listening.append(asyncio.ensure_future(notice_of(scope).wait()))  # and ignores it
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        got.append((await receive())["type"])

    call = asyncio.ensure_future(InFlightMiddleware(app, gate=gate)(http_scope(), *_io()))
    await settle()
    gate.close()
    gate.end_streams()
    await settle()
    assert got == []
    gate.cut_off()
    with pytest.raises(OSError, match="RUNTIME_DRAIN_RESPONSE_CUT"):
        await call
    assert got == ["http.disconnect"]


async def test_spread_places_each_waiter() -> None:
    """With a spread, each waiting handler's wait() returns at its own instant, in order."""
    gate = IntakeGate()
    app, scopes, release = holding()
    middleware = InFlightMiddleware(app, gate=gate, notice_spread=0.2)
    calls = [asyncio.ensure_future(middleware(http_scope(), *_io())) for _ in range(2)]
    await settle()
    loop = asyncio.get_running_loop()
    returned: list[float] = []

    async def wait(scope: Message) -> None:
        await notice_of(scope).wait()
        returned.append(loop.time())

    waits = [asyncio.ensure_future(wait(scope)) for scope in scopes]
    await settle()
    gate.close()
    begun = loop.time()
    gate.end_streams()
    await asyncio.gather(*waits)
    assert returned[0] - begun < 0.05
    assert returned[1] - begun >= 0.09  # its place: half of the 0.2 s window
    release.set()
    await asyncio.gather(*calls)


async def test_deadline_counts_down_to_cutoff() -> None:
    """deadline is None while serving, the seconds left until the cutoff while draining, and 0
    once the cutoff came."""
    clock = ManualClock()
    runtime = Runtime(control_token=TOKEN, clock=clock, stream_grace=0.5, drain_on_signal=False)
    app, scopes, release = holding()
    call = asyncio.ensure_future(runtime.wrap(app)(http_scope(), *_io()))
    await settle()
    notice = notice_of(scopes[0])
    assert notice.deadline is None
    assert not notice.draining
    runtime.drain.begin(drain_request(timeout_ms=2000))
    await settle()
    assert notice.draining
    assert notice.deadline == pytest.approx(2.0 - 0.2)  # the release margin: 10 % of 2 s
    await clock.advance(0.5)
    assert notice.deadline == pytest.approx(1.3)
    await clock.advance(1.4)
    assert notice.deadline == 0.0
    release.set()
    await call


async def test_waiting_websocket_closes_itself() -> None:
    """A WebSocket handler that waits on the notice is not closed 1012 at its instant: it sends
    a last message and closes with its own code; the drain closes it only at the cutoff."""
    gate = IntakeGate()
    recorder = ASGIRecorder({"type": "websocket.connect"})

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        await notice_of(scope).wait()
        await send({"type": "websocket.send", "text": "moving to the next generation"})
        await send({"type": "websocket.close", "code": 1001, "reason": "going away"})

    ws = {"type": "websocket", "path": "/ws", "root_path": "", "extensions": {}}
    call = asyncio.ensure_future(
        InFlightMiddleware(app, gate=gate)(ws, recorder.receive, recorder.send)
    )
    await settle()
    gate.close()
    gate.end_streams()
    await call
    assert recorder.sent == [
        {"type": "websocket.accept"},
        {"type": "websocket.send", "text": "moving to the next generation"},
        {"type": "websocket.close", "code": 1001, "reason": "going away"},
    ]
    assert gate.statistics().closed_at_grace == 0


async def test_uvicorn_request_freed_without_collector(serve: Any) -> None:
    """A request ended under uvicorn is freed as it ends, not left to the collector: its scope
    holds the notice and the notice its cycle, whose scope it is, until the request ends."""
    gate = IntakeGate()
    cycles: list[weakref.ref[Any]] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        cycles.append(weakref.ref(send.__self__))
        notice_of(scope)  # the notice is there while the request runs
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    gc.disable()
    try:
        serve(InFlightMiddleware(app, gate=gate), GET + GET)  # the second replaces the first
        await settle()
        assert len(cycles) == 2
        assert cycles[0]() is None
    finally:
        gc.enable()


async def test_wait_after_request_ended_returns_at_notice() -> None:
    """A notice kept past the end of its request still answers: ``wait()`` returns at the
    stream notice (no place in the spread is left to take) and ``deadline`` reads as before."""
    gate = IntakeGate()
    seen: list[Message] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        seen.append(scope)

    await InFlightMiddleware(app, gate=gate)(
        http_scope(), ASGIRecorder().receive, ASGIRecorder().send
    )
    notice = notice_of(seen[0])
    waiting = asyncio.ensure_future(notice.wait())
    gate.close()
    await settle()
    assert not waiting.done()
    assert notice.draining
    gate.end_streams()
    await asyncio.wait_for(waiting, 1)


async def test_uvicorn_connection_lends_its_notice_in_turn(serve: Any) -> None:
    """Under uvicorn a connection's requests, one after another, are each handed the
    connection's notice while they run: the second request's handler waits on it and is told
    through it alone, as the first one's would have been."""
    gate = IntakeGate()
    told: list[str] = []
    started = asyncio.Event()
    stream = sse_app(told, started)
    notices: list[DrainNotice] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        notices.append(notice_of(scope))
        if len(notices) == 2:
            await stream(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    _, transport = serve(InFlightMiddleware(app, gate=gate), GET + GET)
    await started.wait()
    await settle()
    assert notices[0] is notices[1]  # the connection's, lent to each request in turn
    gate.close()
    gate.end_streams()
    await settle()
    assert told == ["notice"]
    assert bytes(transport.written).endswith(b"\r\n0\r\n\r\n")
    assert not transport.aborted
    assert gate.statistics().http == 0


async def test_uvicorn_request_over_running_one_gets_own_notice(serve: Any) -> None:
    """A request that starts while the connection's last one still runs (its response sent,
    its app not returned) gets a notice of its own; each names its own request."""
    gate = IntakeGate()
    release = asyncio.Event()
    notices: list[DrainNotice] = []
    scopes: list[Message] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        notices.append(notice_of(scope))
        scopes.append(scope)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        if len(notices) == 1:
            await release.wait()  # work after the response, as a background task

    serve(InFlightMiddleware(app, gate=gate), GET + GET)
    await settle()
    assert len(notices) == 2
    assert notices[0] is not notices[1]
    assert scopes[0]["extensions"] is not scopes[1]["extensions"]
    assert gate.statistics().http == 1
    release.set()
    await settle()
    assert gate.statistics().http == 0


async def test_uvicorn_extensions_stay_the_request_own(serve: Any) -> None:
    """What an app puts in a request's extensions under uvicorn stays that request's: the next
    request on the connection gets extensions holding the notice alone."""
    gate = IntakeGate()
    seen: list[list[str]] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        seen.append(list(scope["extensions"]))
        scope["extensions"]["app.private"] = object()
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    serve(InFlightMiddleware(app, gate=gate), GET + GET)
    await settle()
    assert seen == [[EXTENSION], [EXTENSION]]
