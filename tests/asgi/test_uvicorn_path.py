"""InFlightMiddleware under uvicorn's own protocol objects, in process: bytes in, bytes out.

A request admitted while serving gets uvicorn's own ``receive`` and ``send`` (nothing wrapped);
the drain must still reach it through uvicorn's request cycle. Each test feeds a request to a
real ``H11Protocol`` / ``HttpToolsProtocol`` over a recording transport and moves the gate by
hand, so the moment the drain begins is exact: no sleeps, no sockets.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from forgezero_lifecycle import ConnectionClosedByDrainError
from forgezero_lifecycle.asgi import _uvicorn
from forgezero_lifecycle.asgi.middleware import InFlightMiddleware
from forgezero_lifecycle.core.gate import IntakeGate
from forgezero_lifecycle.testing import settle

pytestmark = pytest.mark.anyio

Message = dict[str, Any]
App = Any
GET = b"GET / HTTP/1.1\r\nHost: test\r\n\r\n"


class Transport(asyncio.Transport):
    """Records what the server writes; can stall like a client that stopped reading."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@pytest.fixture(params=["h11", "httptools"])
def serve(request: pytest.FixtureRequest) -> Any:
    """``serve(app, data)``: one connection of uvicorn's ``--http`` protocol, fed ``data``."""

    def start(app: App, data: bytes) -> tuple[Any, Transport]:
        config = uvicorn.Config(app, http=request.param, lifespan="off", log_level="warning")
        config.load()
        protocol = config.http_protocol_class(
            config=config, server_state=ServerState(), app_state={}
        )
        transport = Transport()
        protocol.connection_made(transport)
        protocol.data_received(data)
        return protocol, transport

    return start


async def notice_then(gate: IntakeGate, resume: asyncio.Event) -> None:
    """Let the request run up to its wait, give the drain's notice, then let the app go on."""
    await settle()
    gate.close()
    gate.end_streams()
    await settle()
    resume.set()
    await settle()


def head(transport: Transport) -> bytes:
    return bytes(transport.written).split(b"\r\n\r\n", 1)[0].lower()


async def test_serving_uses_server_send(serve: Any) -> None:
    """Nothing is wrapped while no drain has begun: the app is handed uvicorn's send itself."""
    owners: list[str] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        owners.append(type(send.__self__).__name__)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    gate = IntakeGate()
    serve(InFlightMiddleware(app, gate=gate), GET)
    await settle()
    assert owners == ["RequestResponseCycle"]
    assert gate.statistics().http == 0


async def test_path_needs_all_uses(serve: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A uvicorn cycle qualifies; one of a uvicorn whose cycle lacks an attribute the drain
    moments set (as if it had been renamed) does not, and is served by the wrapped path."""
    monkeypatch.setattr(_uvicorn, "KNOWN_CYCLES", {})
    cycles: list[Any] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        cycles.append(send.__self__)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    serve(app, GET)
    await settle()
    real = cycles[0]
    assert _uvicorn.learn(real) is True
    changed = type("RequestResponseCycle", (), {"__module__": type(real).__module__})()
    vars(changed).update(vars(real))
    del changed.default_headers
    assert _uvicorn.learn(changed) is False
    assert [_uvicorn.KNOWN_CYCLES[type(c)] for c in (real, changed)] == [True, False]


async def test_early_drain_closes(serve: Any) -> None:
    """Admitted one step before the drain begins, the response still says Connection: close
    and the connection is closed after it."""
    gate = IntakeGate()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        gate.begin_draining()  # the first thing after admission, before any await
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    _, transport = serve(InFlightMiddleware(app, gate=gate), GET)
    await settle()
    assert b"connection: close" in head(transport)
    assert transport.closed
    assert not transport.aborted


@pytest.mark.parametrize("waiting", [True, False], ids=["waiting-at-notice", "receive-later"])
async def test_receive_after_body_ends(serve: Any, waiting: bool) -> None:
    """Whether the stream waits on receive() at the notice or calls it later, it gets
    http.disconnect, and the chunked response it leaves unfinished is cut so the client can
    tell: the connection aborted, no terminating chunk."""
    gate = IntakeGate()
    later = asyncio.Event()
    got: list[Message] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        if not waiting:
            await later.wait()
        got.append(await receive())

    _, transport = serve(InFlightMiddleware(app, gate=gate), GET)
    await notice_then(gate, later)
    assert got == [{"type": "http.disconnect"}]
    assert bytes(transport.written).endswith(b"4\r\npart\r\n")
    assert transport.aborted
    assert gate.statistics().http == 0


async def test_answer_across_notice_whole(serve: Any) -> None:
    """A request that read its body and does not wait on receive() is not told to stop."""
    gate = IntakeGate()
    ready = asyncio.Event()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        body = (await receive())["body"]
        await ready.wait()
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    post = b"POST / HTTP/1.1\r\nHost: test\r\nContent-Length: 7\r\n\r\npayload"
    _, transport = serve(InFlightMiddleware(app, gate=gate), post)
    await notice_then(gate, ready)
    assert b"connection: close" in head(transport)
    assert bytes(transport.written).endswith(b"\r\n\r\npayload")
    assert gate.statistics().http == 0


async def test_blocked_send_given_up(serve: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The blocked send is let go, the next one raises ConnectionClosedByDrainError (an OSError),
    the app's error stays inside, the connection is aborted and the count released."""
    gate = IntakeGate()
    raised: list[BaseException] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            while True:
                await send({"type": "http.response.body", "body": b"x", "more_body": True})
        except OSError as error:
            raised.append(error)
            raise

    protocol, transport = serve(InFlightMiddleware(app, gate=gate), GET)
    protocol.pause_writing()  # the client stopped reading: the first body send blocks
    await settle()
    gate.close()
    gate.end_streams()
    await settle()
    assert gate.statistics().http == 1
    with caplog.at_level(logging.WARNING):
        gate.cut_off()
        await settle()
    assert [type(error) for error in raised] == [ConnectionClosedByDrainError]
    assert transport.aborted
    assert gate.statistics().http == 0
    assert [r.getMessage() for r in caplog.records] == ["drain.connection_abandoned kind=http"]


async def test_late_failure_answered(
    serve: Any,
) -> None:
    """The disconnect told to the app is undone before uvicorn handles its error: the client,
    still there, gets uvicorn's 500 rather than nothing."""
    gate = IntakeGate()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        if (await receive())["type"] == "http.disconnect":
            raise RuntimeError("the app's own failure after the notice")

    _, transport = serve(InFlightMiddleware(app, gate=gate), GET)
    await settle()
    gate.close()
    gate.end_streams()
    await settle()
    assert bytes(transport.written).startswith(b"HTTP/1.1 500 ")
    assert gate.statistics().http == 0


async def test_uvicorn_wrapper_given_bound_call(serve: Any) -> None:
    """uvicorn's own wrapper (ProxyHeadersMiddleware) is handed the middleware's bound
    ``__call__`` at the first call, so later requests skip an instance's call; they are
    served and counted as before."""
    seen: list[str] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    gate = IntakeGate()
    middleware = InFlightMiddleware(app, gate=gate)
    protocol, transport = serve(middleware, GET + GET)
    await settle()
    assert protocol.app.app == middleware.__call__
    assert seen == ["/", "/"]
    assert bytes(transport.written).count(b"HTTP/1.1 204") == 2
    assert gate.statistics().http == 0


async def test_running_request_found_through_drain_flow(serve: Any) -> None:
    """A running uvicorn request is found among the running ones (what the spread's later
    instants look for) also once the drain has put its DrainFlow on the cycle."""
    release = asyncio.Event()
    cycles: list[Any] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        cycles.append(send.__self__)
        await release.wait()
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    gate = IntakeGate()
    middleware = InFlightMiddleware(app, gate=gate)
    serve(middleware, GET)
    await settle()
    running = middleware._running
    assert list(running) == cycles
    assert cycles[0] in running
    cycles[0].flow = _uvicorn.DrainFlow(cycles[0], cycles[0].flow)
    assert cycles[0] in running
    assert len(running) == 1
    release.set()
    await settle()
    assert cycles[0] not in running
    assert len(running) == 0


async def test_flow_control_without_attributes_still_served(serve: Any) -> None:
    """A uvicorn whose flow control takes no attribute (where the connection's notice is
    kept) still serves and counts each request, with a notice of its own."""
    gate = IntakeGate()
    notices: list[Any] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        notices.append(scope["extensions"]["forgezero.drain"])
        assert gate.statistics().http == 1
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    class SlottedFlow:
        __slots__ = ("server_flow",)

        def __init__(self, flow: Any) -> None:
            self.server_flow = flow

        def __getattr__(self, name: str) -> Any:
            return getattr(self.server_flow, name)

    protocol, transport = serve(InFlightMiddleware(app, gate=gate), GET)
    protocol.flow = protocol.cycle.flow = SlottedFlow(protocol.flow)  # before the app runs
    await settle()
    protocol.data_received(GET)
    await settle()
    assert len(notices) == 2
    assert notices[0] is not notices[1]
    assert bytes(transport.written).count(b"HTTP/1.1 204") == 2
    assert gate.statistics().http == 0
