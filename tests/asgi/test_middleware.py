"""InFlightMiddleware at message level: scripted receive, recorded send, exact messages."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from forgezero_lifecycle import ConnectionClosedByDrainError
from forgezero_lifecycle.asgi.middleware import InFlightMiddleware
from forgezero_lifecycle.core.gate import IntakeGate
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.testing import ASGIRecorder, settle

pytestmark = pytest.mark.anyio

Message = dict[str, Any]


def http_scope(path: str = "/work", root_path: str = "", method: str = "GET") -> Message:
    return {"type": "http", "path": path, "root_path": root_path, "method": method, "headers": []}


def ws_scope(extensions: Message | None = None) -> Message:
    return {"type": "websocket", "path": "/ws", "root_path": "", "extensions": extensions or {}}


async def ok_app(scope: Message, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_lifespan_untouched() -> None:
    """Lifespan scopes reach the app as they are, with the server's own receive and send."""
    seen: list[Any] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        seen.append((scope, receive, send))

    recorder = ASGIRecorder()
    scope = {"type": "lifespan"}
    await InFlightMiddleware(app, gate=IntakeGate())(scope, recorder.receive, recorder.send)
    assert seen == [(scope, recorder.receive, recorder.send)]


async def test_request_counted() -> None:
    """An admitted request counts while the app runs, including after its last body chunk."""
    gate = IntakeGate()
    finish = asyncio.Event()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await ok_app(scope, receive, send)
        await finish.wait()  # a background task after the response

    recorder = ASGIRecorder({"type": "http.request", "body": b""})
    call = asyncio.ensure_future(
        InFlightMiddleware(app, gate=gate)(http_scope(), recorder.receive, recorder.send)
    )
    await settle()
    assert recorder.sent[-1]["body"] == b"ok"
    assert gate.statistics().http == 1
    finish.set()
    await call
    assert gate.statistics().http == 0


async def test_refused_request_503() -> None:
    """While closed: 503, Retry-After, Connection: close, Content-Length, RUNTIME_DRAINING."""
    gate = IntakeGate()
    gate.close()
    called = False

    async def app(scope: Message, receive: Any, send: Any) -> None:
        nonlocal called
        called = True

    recorder = ASGIRecorder()
    await InFlightMiddleware(app, gate=gate, retry_after=2)(
        http_scope(), recorder.receive, recorder.send
    )
    assert not called
    start, body = recorder.sent
    assert start["status"] == 503
    headers = dict(start["headers"])
    assert headers[b"retry-after"] == b"2"
    assert headers[b"connection"] == b"close"
    assert headers[b"content-length"] == str(len(body["body"])).encode()
    assert body["body"] == b'{"error":"RUNTIME_DRAINING"}'
    assert gate.statistics().http == 0


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param([], [(b"connection", b"close")], id="added"),
        pytest.param([(b"Connection", b"close")], [(b"Connection", b"close")], id="kept-once"),
    ],
)
async def test_draining_connection_close(
    given: list[tuple[bytes, bytes]], expected: list[tuple[bytes, bytes]]
) -> None:
    """A response started while draining gains Connection: close unless it already has one."""
    gate = IntakeGate()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        gate.begin_draining()
        await send({"type": "http.response.start", "status": 200, "headers": scope["h"]})
        await send({"type": "http.response.body", "body": b""})

    recorder = ASGIRecorder()
    scope = {**http_scope(), "h": given}
    await InFlightMiddleware(app, gate=gate)(scope, recorder.receive, recorder.send)
    assert recorder.sent[0]["headers"] == expected


@pytest.mark.parametrize("version", ["2", "3"])
async def test_h2_h3_no_connection_header(version: str) -> None:
    """``connection`` is forbidden in HTTP/2 and HTTP/3 (RFC 9113 8.2.2, RFC 9114 4.2): neither a
    response started while draining nor the refusal carries it; the rest is as under HTTP/1.1."""
    gate = IntakeGate()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        gate.close()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x", b"1")]})
        await send({"type": "http.response.body", "body": b"ok"})

    middleware = InFlightMiddleware(app, gate=gate)
    scope = {**http_scope(), "http_version": version}
    answered, refused = ASGIRecorder(), ASGIRecorder()
    await middleware(scope, answered.receive, answered.send)
    await middleware(scope, refused.receive, refused.send)
    assert answered.sent[0]["headers"] == [(b"x", b"1")]
    assert answered.sent[1]["body"] == b"ok"
    assert refused.sent[0]["status"] == 503
    assert [name for name, _ in refused.sent[0]["headers"]] == [
        b"content-type",
        b"content-length",
        b"retry-after",
    ]


async def test_serving_keeps_connection() -> None:
    """Outside a drain responses are passed on unchanged."""
    recorder = ASGIRecorder({"type": "http.request", "body": b""})
    await InFlightMiddleware(ok_app, gate=IntakeGate())(
        http_scope(), recorder.receive, recorder.send
    )
    assert recorder.sent[0] == {"type": "http.response.start", "status": 200, "headers": []}


async def test_stream_ended_at_notice() -> None:
    """After the stream grace a streaming response gets http.disconnect; the response it leaves
    unfinished is never ended cleanly: under a server the middleware does not know, it raises
    RUNTIME_DRAIN_RESPONSE_CUT, so the server closes the connection without a last chunk."""
    gate = IntakeGate()
    got: list[Message] = []

    async def streaming(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        got.append(await receive())  # blocks until the client leaves (or the notice)

    recorder = ASGIRecorder({"type": "http.request", "body": b""})
    call = asyncio.ensure_future(
        InFlightMiddleware(streaming, gate=gate)(http_scope(), recorder.receive, recorder.send)
    )
    await settle()
    assert not call.done()
    gate.close()
    gate.end_streams()
    with pytest.raises(ConnectionClosedByDrainError) as raised:
        await call
    assert raised.value.code == "RUNTIME_DRAIN_RESPONSE_CUT"
    assert got == [{"type": "http.disconnect"}]
    assert recorder.sent[-1] == {"type": "http.response.body", "body": b"part", "more_body": True}
    assert gate.statistics().http == 0


async def test_body_read_during_drain() -> None:
    """The notice never cuts a request body that is still arriving (an upload: POST)."""
    gate = IntakeGate()
    bodies: list[bytes] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            bodies.append(message["body"])
            if not message.get("more_body"):
                break

    recorder = ASGIRecorder({"type": "http.request", "body": b"a", "more_body": True})
    middleware = InFlightMiddleware(app, gate=gate)
    call = asyncio.ensure_future(
        middleware(http_scope(method="POST"), recorder.receive, recorder.send)
    )
    await settle()
    gate.close()
    gate.end_streams()
    await settle()
    recorder.push({"type": "http.request", "body": b"b", "more_body": False})
    await call
    assert bodies == [b"a", b"b"]


async def test_websocket_1012_at_notice() -> None:
    """An open WebSocket is closed 1012 'draining'; an app send after that raises an OSError
    (the ASGI rule for a send on a closed connection) and never reaches the server."""
    gate = IntakeGate()
    closed_by_server = asyncio.Event()
    raised: list[BaseException] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        await closed_by_server.wait()
        try:
            await send({"type": "websocket.send", "text": "late"})
        except OSError as error:
            raised.append(error)
        await send({"type": "websocket.close", "code": 1000})  # a cleanup close is harmless

    recorder = ASGIRecorder({"type": "websocket.connect"})
    middleware = InFlightMiddleware(app, gate=gate, websocket_close_code=1012)
    call = asyncio.ensure_future(middleware(ws_scope(), recorder.receive, recorder.send))
    await settle()
    assert gate.statistics().websocket == 1
    gate.close()
    gate.end_streams()
    await settle()
    closed_by_server.set()
    await call
    assert recorder.sent == [
        {"type": "websocket.accept"},
        {"type": "websocket.close", "code": 1012, "reason": "draining"},
    ]
    (error,) = raised
    assert isinstance(error, ConnectionClosedByDrainError)
    assert error.code == "RUNTIME_DRAIN_CONNECTION_CLOSED"
    assert gate.statistics().websocket == 0


async def test_push_websocket_ends() -> None:
    """A handler that only sends and never calls receive() learns of the drain's close from its
    next send, so it returns and its count is released; its unhandled error stays inside."""
    gate = IntakeGate()
    ticks: asyncio.Queue[str] = asyncio.Queue()

    async def pusher(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        while True:  # no try/except: the error must not escape into the server
            await send({"type": "websocket.send", "text": await ticks.get()})

    recorder = ASGIRecorder({"type": "websocket.connect"})
    call = asyncio.ensure_future(
        InFlightMiddleware(pusher, gate=gate)(ws_scope(), recorder.receive, recorder.send)
    )
    ticks.put_nowait("one")
    await settle()
    gate.close()
    gate.end_streams()
    await settle()
    ticks.put_nowait("two")
    await settle()
    assert call.done()
    await call
    assert [m["type"] for m in recorder.sent] == [
        "websocket.accept",
        "websocket.send",
        "websocket.close",
    ]
    assert gate.statistics().websocket == 0


async def test_denial_parts_sent_whole() -> None:
    """A denial response sent as several websocket.http.response.body parts reaches the server
    part by part; only the last part (more_body false) ends the session."""
    gate = IntakeGate()

    async def deny(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.http.response.start", "status": 403, "headers": []})
        await send({"type": "websocket.http.response.body", "body": b"go ", "more_body": True})
        await send({"type": "websocket.http.response.body", "body": b"away"})

    recorder = ASGIRecorder({"type": "websocket.connect"})
    scope = ws_scope({"websocket.http.response": {}})
    await InFlightMiddleware(deny, gate=gate)(scope, recorder.receive, recorder.send)
    assert [m.get("body") for m in recorder.sent] == [None, b"go ", b"away"]
    assert gate.statistics().websocket == 0


async def test_notice_spares_denial() -> None:
    """The drain never sends websocket.close into a denial the app is still sending."""
    gate = IntakeGate()
    rest = asyncio.Event()

    async def deny(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.http.response.start", "status": 403, "headers": []})
        await send({"type": "websocket.http.response.body", "body": b"go ", "more_body": True})
        await rest.wait()
        await send({"type": "websocket.http.response.body", "body": b"away"})

    recorder = ASGIRecorder({"type": "websocket.connect"})
    scope = ws_scope({"websocket.http.response": {}})
    call = asyncio.ensure_future(
        InFlightMiddleware(deny, gate=gate)(scope, recorder.receive, recorder.send)
    )
    await settle()
    gate.close()
    gate.end_streams()
    await settle()
    rest.set()
    await call
    assert [m["type"] for m in recorder.sent] == [
        "websocket.http.response.start",
        "websocket.http.response.body",
        "websocket.http.response.body",
    ]


class StalledClient:
    """A recording send that blocks, like a server's flow control, once ``stall()`` is called:
    the client has stopped reading and the server's write buffer is full."""

    def __init__(self, recorder: ASGIRecorder) -> None:
        self.recorder = recorder
        self.stalled = False
        self.blocked = 0
        self._never = asyncio.Event()

    def stall(self) -> None:
        self.stalled = True

    async def send(self, message: Message) -> None:
        if self.stalled:
            self.blocked += 1
            await self._never.wait()  # cancelled when the middleware gives the send up
        await self.recorder.send(message)


async def test_blocked_send_oserror() -> None:
    """An app send made while draining and still blocked at the cutoff raises
    ConnectionClosedByDrainError (an OSError); later sends raise at once without reaching the server."""
    gate = IntakeGate()
    raised: list[BaseException] = []
    recorder = ASGIRecorder({"type": "http.request", "body": b""})
    client = StalledClient(recorder)

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        client.stall()
        gate.begin_draining()
        for _ in range(2):
            try:
                await send({"type": "http.response.body", "body": b"x", "more_body": True})
            except OSError as error:
                raised.append(error)

    call = asyncio.ensure_future(
        InFlightMiddleware(app, gate=gate)(http_scope(), recorder.receive, client.send)
    )
    await settle()
    assert not call.done()
    gate.cut_off()
    await settle()
    await call
    assert [type(e) for e in raised] == [ConnectionClosedByDrainError, ConnectionClosedByDrainError]
    assert raised[0].code == "RUNTIME_DRAIN_CONNECTION_ABANDONED"
    assert client.blocked == 1
    assert gate.statistics().http == 0


async def test_free_send_after_cutoff() -> None:
    """The cutoff gives up only on sends that are blocked: a reading client gets its bytes."""
    gate = IntakeGate()
    gate.begin_draining()
    gate.cut_off()
    recorder = ASGIRecorder({"type": "http.request", "body": b""})
    await InFlightMiddleware(ok_app, gate=gate)(http_scope(), recorder.receive, recorder.send)
    assert [m["type"] for m in recorder.sent] == ["http.response.start", "http.response.body"]
    assert recorder.sent[1]["body"] == b"ok"
    assert gate.statistics().http == 0


async def test_stuck_push_ws_abandoned() -> None:
    """A WebSocket send blocked by a stalled client is given up at the cutoff; the drain's own
    close is not attempted behind it, and the count is released."""
    gate = IntakeGate()
    recorder = ASGIRecorder({"type": "websocket.connect"})
    client = StalledClient(recorder)
    raised: list[BaseException] = []

    async def pusher(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        client.stall()
        gate.close()
        try:
            await send({"type": "websocket.send", "text": "tick"})
        except OSError as error:
            raised.append(error)

    call = asyncio.ensure_future(
        InFlightMiddleware(pusher, gate=gate)(ws_scope(), recorder.receive, client.send)
    )
    await settle()
    gate.end_streams()
    await settle()
    assert not call.done()
    gate.cut_off()
    await settle()
    await call
    assert [getattr(e, "code", None) for e in raised] == ["RUNTIME_DRAIN_CONNECTION_ABANDONED"]
    assert recorder.sent == [{"type": "websocket.accept"}]
    assert gate.statistics().websocket == 0


async def test_app_error_propagates() -> None:
    """Only what the drain's own ConnectionClosedByDrainError caused is kept from the server."""
    gate = IntakeGate()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        raise OSError("the app's own failure")

    recorder = ASGIRecorder({"type": "websocket.connect"})
    with pytest.raises(OSError, match="own failure"):
        await InFlightMiddleware(app, gate=gate)(ws_scope(), recorder.receive, recorder.send)
    assert gate.statistics().websocket == 0


async def test_websocket_denied_503() -> None:
    """With websocket.http.response the handshake is denied with the same 503 body."""
    gate = IntakeGate()
    gate.close()
    recorder = ASGIRecorder({"type": "websocket.connect"})
    scope = ws_scope({"websocket.http.response": {}})
    await InFlightMiddleware(ok_app, gate=gate)(scope, recorder.receive, recorder.send)
    assert recorder.sent[0]["type"] == "websocket.http.response.start"
    assert recorder.sent[0]["status"] == 503
    assert recorder.sent[1] == {
        "type": "websocket.http.response.body",
        "body": b'{"error":"RUNTIME_DRAINING"}',
    }


async def test_websocket_closed_1013() -> None:
    """Without the denial extension the handshake is closed with 1013 (try again later)."""
    gate = IntakeGate()
    gate.close()
    recorder = ASGIRecorder({"type": "websocket.connect"})
    await InFlightMiddleware(ok_app, gate=gate)(ws_scope(), recorder.receive, recorder.send)
    assert recorder.sent == [{"type": "websocket.close", "code": 1013, "reason": "draining"}]


@pytest.mark.parametrize(
    ("path", "root_path"),
    [("/.forgezero/runtime/ready", ""), ("/api/.forgezero/runtime/ready", "/api")],
)
async def test_control_paths_uncounted(path: str, root_path: str) -> None:
    """Control paths (after root_path) bypass counting and refusal and reach the control app."""
    gate = IntakeGate()
    gate.close()
    reached: list[str] = []

    async def control(scope: Message, receive: Any, send: Any) -> None:
        reached.append(scope["path"])
        assert gate.statistics().http == 0

    recorder = ASGIRecorder()
    middleware = InFlightMiddleware(ok_app, gate=gate, control=control)
    await middleware(http_scope(path, root_path), recorder.receive, recorder.send)
    assert reached == [path]


async def test_exempt_scopes_pass() -> None:
    """A user exempt predicate lets e.g. a metrics path through during a drain."""
    gate = IntakeGate()
    gate.close()
    recorder = ASGIRecorder({"type": "http.request", "body": b""})
    middleware = InFlightMiddleware(ok_app, gate=gate, exempt=lambda s: s["path"] == "/metrics")
    await middleware(http_scope("/metrics"), recorder.receive, recorder.send)
    assert recorder.sent[0]["status"] == 200


async def test_count_released_on_raise() -> None:
    """An app exception still releases the count (try/finally)."""
    gate = IntakeGate()

    async def broken(scope: Message, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    recorder = ASGIRecorder()
    with pytest.raises(RuntimeError):
        await InFlightMiddleware(broken, gate=gate)(http_scope(), recorder.receive, recorder.send)
    assert gate.statistics().http == 0


async def test_close_group_stays_inside() -> None:
    """A task group that re-raises the drain's error in a group is kept from the server too."""
    gate = IntakeGate()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        await gate.notice.wait()
        await settle()
        errors: list[Exception] = []
        try:
            await send({"type": "websocket.send", "text": "late"})
        except OSError as error:
            errors.append(error)
        raise ExceptionGroup("task group", errors)  # outside the except: no __context__

    recorder = ASGIRecorder({"type": "websocket.connect"})
    call = asyncio.ensure_future(
        InFlightMiddleware(app, gate=gate)(ws_scope(), recorder.receive, recorder.send)
    )
    await settle()
    gate.close()
    gate.end_streams()
    await call
    assert recorder.sent[-1] == {"type": "websocket.close", "code": 1012, "reason": "draining"}
    assert gate.statistics().websocket == 0


@pytest.mark.parametrize(
    ("path", "root_path"),
    [("/x/.forgezero/runtime/ready", ""), ("/other/.forgezero/runtime/ready", "/api")],
)
async def test_inner_prefix_counted(path: str, root_path: str) -> None:
    """Only a path that starts with the control prefix once root_path is removed is control."""
    gate = IntakeGate()
    seen: list[int] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        seen.append(gate.statistics().http)
        await ok_app(scope, receive, send)

    async def control(scope: Message, receive: Any, send: Any) -> None:
        raise AssertionError("not a control path")

    recorder = ASGIRecorder({"type": "http.request", "body": b""})
    middleware = InFlightMiddleware(app, gate=gate, control=control)
    await middleware(http_scope(path, root_path), recorder.receive, recorder.send)
    assert seen == [1]
    assert recorder.sent[0]["status"] == 200


async def test_exempt_asked_each_time() -> None:
    """The predicate is consulted per request, not once: a later exempt scope still passes."""
    gate = IntakeGate()
    middleware = InFlightMiddleware(ok_app, gate=gate, exempt=lambda s: s["path"] == "/metrics")
    recorder = ASGIRecorder({"type": "http.request", "body": b""})
    await middleware(http_scope("/work"), recorder.receive, recorder.send)
    gate.close()
    recorder = ASGIRecorder({"type": "http.request", "body": b""})
    await middleware(http_scope("/metrics"), recorder.receive, recorder.send)
    assert recorder.sent[0]["status"] == 200


async def test_lifespan_rehooks() -> None:
    """After a lifespan the app does not speak, the next request tries the signal hook again,
    even when a request before it had already tried."""
    runtime = Runtime(control_token="test-control-token-0123456789")

    async def app(scope: Message, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            raise RuntimeError("this app has no lifespan")
        await ok_app(scope, receive, send)

    middleware = runtime.wrap(app)
    signals = runtime.signal_drain
    await middleware(http_scope(), ASGIRecorder({"type": "http.request"}).receive, _ignore)
    assert not signals.pending  # the first request tried the hook
    with pytest.raises(RuntimeError, match="no lifespan"):
        await middleware({"type": "lifespan"}, _never, _ignore)
    assert signals.pending  # put back with final=False: the next request tries again
    await middleware(http_scope(), ASGIRecorder({"type": "http.request"}).receive, _ignore)
    assert not signals.pending


async def _never() -> Message:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def _ignore(message: Message) -> None:
    return None


async def test_websocket_old_send_given_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A push-only WebSocket whose send was blocked by a stalled client before the drain began:
    the notice does not wait behind it without bound, the cutoff cancels the task blocked in it
    (the middleware takes that cancel back), the connection is abandoned and logged once, and the
    count is released; nothing was sent after the accept."""
    gate = IntakeGate()
    recorder = ASGIRecorder({"type": "websocket.connect"})
    client = StalledClient(recorder)
    cancelled: list[BaseException] = []

    async def pusher(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        client.stall()
        try:
            await send({"type": "websocket.send", "text": "tick"})
        except asyncio.CancelledError as error:
            cancelled.append(error)
            raise

    call = asyncio.ensure_future(
        InFlightMiddleware(pusher, gate=gate)(ws_scope(), recorder.receive, client.send)
    )
    await settle()
    assert client.blocked == 1
    gate.close()
    gate.end_streams()
    await settle()
    assert not call.done()
    with caplog.at_level(logging.WARNING, logger="forgezero_lifecycle.middleware"):
        gate.cut_off()
        await settle()
        await asyncio.wait_for(call, 1.0)
    assert len(cancelled) == 1
    assert recorder.sent == [{"type": "websocket.accept"}]
    assert gate.statistics().websocket == 0
    abandoned = [r for r in caplog.records if "connection_abandoned" in r.getMessage()]
    assert [r.getMessage() for r in abandoned] == ["drain.connection_abandoned kind=websocket"]
    # Inside a running test there is always a current task (the Optional is never None here).
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
