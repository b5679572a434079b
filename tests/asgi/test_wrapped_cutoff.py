"""The drain's cutoff on the wrapped path: a send blocked since before the drain is given up.

A wrapped request (HTTP/2 under hypercorn, any request under a server without an unwrapped
path) is handed the server's own send coroutine while no drain has begun. When that send is
still blocked by a client that does not read at the cutoff, the task blocked in it is cancelled
and the request counted out, so the drain ends before its deadline; nothing else is cancelled.
The drains run on a manual clock, moved to the cutoff and never to the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import h2.config
import h2.connection
import h2.events
import httpx
import pytest

from forgezero_lifecycle.asgi.middleware import InFlightMiddleware
from forgezero_lifecycle.core._httpx import tls_context
from forgezero_lifecycle.core.gate import IntakeGate
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.testing import ManualClock, settle
from tests.asgi._hypercorn_server import BOUND, Message, until

pytestmark = pytest.mark.anyio

TOKEN = "wrapped-cutoff-token-0123456789"
NONCE = "W" * 43
TIMEOUT_S = 10.0
#: When the runtime's cutoff comes in a drain of TIMEOUT_S (its release margin is 1 s).
CUTOFF_S = TIMEOUT_S - 1.0
CHUNK = b"x" * 16384
START: Message = {"type": "http.response.start", "status": 200, "headers": []}


def drain_request() -> dict[str, Any]:
    return {
        "protocol": "forgezero-drain/v1",
        "nonce": NONCE,
        "sourceRevision": "a" * 40,
        "targetRevision": "b" * 40,
        "timeoutMs": int(TIMEOUT_S * 1000),
    }


def runtime_on(clock: ManualClock) -> Runtime:
    """A runtime whose stream notice comes at once and whose cutoff comes at CUTOFF_S."""
    return Runtime(control_token=TOKEN, clock=clock, stream_grace=0.0, drain_on_signal=False)


class NonReadingH2Client:
    """A cleartext HTTP/2 client (prior knowledge) that reads what the server sends but never
    opens a flow-control window: the server may send 65535 bytes, no more."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.h2 = h2.connection.H2Connection(config)
        self.events: list[h2.events.Event] = []
        self.closed = asyncio.Event()
        self._reading: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, port: int) -> NonReadingH2Client:
        client = cls(*await asyncio.open_connection("127.0.0.1", port))
        client.h2.initiate_connection()
        await client._flush()
        client._reading = asyncio.ensure_future(client._read())
        return client

    async def get(self, path: str = "/") -> int:
        stream_id: int = self.h2.get_next_available_stream_id()
        headers = [(":method", "GET"), (":path", path), (":scheme", "http"), (":authority", "t")]
        self.h2.send_headers(stream_id, headers, end_stream=True)
        await self._flush()
        return stream_id

    def received(self, kind: type[h2.events.Event]) -> list[Any]:
        return [event for event in self.events if isinstance(event, kind)]

    async def _read(self) -> None:
        # Frames are parsed (and SETTINGS acknowledged), but received data is never
        # acknowledged: no WINDOW_UPDATE ever leaves this client.
        while data := await self.reader.read(65536):
            self.events.extend(self.h2.receive_data(data))
            await self._flush()
        self.closed.set()

    async def _flush(self) -> None:
        self.writer.write(self.h2.data_to_send())
        await self.writer.drain()

    async def aclose(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


def blocked_in_flow_control(send: Any) -> bool:
    """Whether the hypercorn HTTP/2 stream behind a wrapped ``send`` has no window left and
    data still to send: its app's last send waits for the client to open the window."""
    stream = send.__self__._send.__self__  # the responder's server send: HTTPStream.app_send
    protocol = stream.send.__self__  # hypercorn's H2Protocol
    buffer = protocol.stream_buffers.get(stream.stream_id)
    window = protocol.connection.local_flow_control_window(stream.stream_id)
    return buffer is not None and len(buffer.buffer) > 0 and window == 0


async def test_old_h2_send_given_up(hypercorn: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A stream whose client never opens its window, streaming since before the drain: at the
    cutoff its blocked send is given up, the request counted out and the drain drained, all
    before the deadline; the stream is closed on the server."""
    clock = ManualClock()
    runtime = runtime_on(clock)
    sends: list[Any] = []
    inside_send = False
    raised: list[type[BaseException]] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        nonlocal inside_send
        sends.append(send)
        await send(START)
        try:
            # More than the window: hypercorn buffers what it cannot send yet, and the last
            # part waits for that buffer to empty, which a client that opens no window stops.
            for _ in range(8):
                await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
            inside_send = True
            await send({"type": "http.response.body", "body": b""})
        except BaseException as error:
            raised.append(type(error))
            raise

    served = await hypercorn(runtime.wrap(app))
    client = await NonReadingH2Client.connect(served.port)
    try:
        stream_id = await client.get()
        await until(lambda: inside_send and blocked_in_flow_control(sends[0]))
        assert type(sends[0].__self__).__name__ == "_HttpResponder"  # the wrapped path
        protocol = sends[0].__self__._send.__self__.send.__self__

        runtime.drain.begin(drain_request())
        await clock.advance(CUTOFF_S / 2)  # well past the notice, before the cutoff
        assert runtime.drain.status(NONCE).in_flight.http == 1
        assert raised == []
        with caplog.at_level(logging.WARNING, logger="forgezero_lifecycle"):
            await clock.advance(CUTOFF_S / 2)  # the cutoff; the deadline is a second away
            assert await asyncio.wait_for(runtime.drain.wait(), BOUND) == "drained"

        status = runtime.drain.status(NONCE)
        assert (status.status, status.failure, status.in_flight.http) == ("drained", None, 0)
        assert clock.monotonic() < TIMEOUT_S
        assert runtime.gate.statistics().http == 0
        assert raised == [asyncio.CancelledError]
        assert "drain.connection_abandoned kind=http" in [
            record.getMessage() for record in caplog.records
        ]
        await until(lambda: stream_id not in protocol.streams)  # hypercorn let the stream go
        assert client.received(h2.events.ResponseReceived)  # the response had started
        assert not client.received(h2.events.StreamEnded)  # and was never finished
    finally:
        await client.aclose()


async def test_app_wait_not_cancelled(
    hypercorn: Any,
) -> None:
    """A wrapped request whose sends before the drain all went through, waiting on something
    of its own at the cutoff, runs on: it finishes its response after the cutoff and the drain
    ends drained."""
    clock = ManualClock()
    runtime = runtime_on(clock)
    waiting = asyncio.Event()
    go_on = asyncio.Event()
    raised: list[type[BaseException]] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        try:
            await send(START)
            await send({"type": "http.response.body", "body": b"before ", "more_body": True})
            waiting.set()
            await go_on.wait()
            await send({"type": "http.response.body", "body": b"after"})
        except BaseException as error:
            raised.append(type(error))
            raise

    served = await hypercorn(runtime.wrap(app))
    async with (
        httpx.AsyncClient(http1=False, http2=True, timeout=BOUND, verify=tls_context()) as http,
        http.stream("GET", served.url + "/") as response,
    ):
        await asyncio.wait_for(waiting.wait(), BOUND)
        runtime.drain.begin(drain_request())
        await clock.advance(CUTOFF_S)
        assert runtime.gate.cutoff.is_set()
        await settle()
        assert raised == []
        assert runtime.drain.status(NONCE).in_flight.http == 1
        go_on.set()
        body = await asyncio.wait_for(response.aread(), BOUND)
    assert (response.http_version, body) == ("HTTP/2", b"before after")
    assert raised == []
    assert await asyncio.wait_for(runtime.drain.wait(), BOUND) == "drained"


class BlockedSend:
    """A server send that blocks every message after the first ``passes`` until released."""

    def __init__(self, passes: int) -> None:
        self.passes = passes
        self.sent: list[Message] = []
        self.release = asyncio.Event()
        self.blocked = asyncio.Event()

    async def __call__(self, message: Message) -> None:
        if len(self.sent) >= self.passes:
            self.blocked.set()
            await self.release.wait()
        self.sent.append(message)


async def _receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


SCOPE: Message = {"type": "http", "http_version": "2", "method": "GET", "path": "/"}


async def _streaming(scope: Message, receive: Any, send: Any) -> None:
    await send(START)
    await send({"type": "http.response.body", "body": b"part", "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def test_server_cancel_stands() -> None:
    """The server cancels the request whose send the cutoff gave up: the task still ends
    cancelled; given up alone it ends normally, with no cancel left pending on it."""
    for server_cancels in (True, False):
        gate = IntakeGate()
        send = BlockedSend(passes=1)
        middleware = InFlightMiddleware(_streaming, gate=gate)
        task = asyncio.ensure_future(middleware(dict(SCOPE), _receive, send))
        await asyncio.wait_for(send.blocked.wait(), BOUND)
        gate.close()
        gate.cut_off()
        if server_cancels:
            task.cancel()
        await asyncio.wait((task,), timeout=BOUND)
        assert task.done()
        assert task.cancelled() is server_cancels
        assert task.cancelling() == int(server_cancels)
        assert gate.statistics().http == 0


async def test_app_task_send_given_up() -> None:
    """The app sends from a task it started (as Starlette's streaming response does): that task
    is the one cancelled, the app's own wait for it ends, and the request is counted out."""
    gate = IntakeGate()
    send = BlockedSend(passes=1)
    child_cancelled: list[bool] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        child = asyncio.ensure_future(_streaming(scope, receive, send))
        await asyncio.wait((child,))
        child_cancelled.append(child.cancelled())

    task = asyncio.ensure_future(InFlightMiddleware(app, gate=gate)(dict(SCOPE), _receive, send))
    await asyncio.wait_for(send.blocked.wait(), BOUND)
    gate.close()
    gate.cut_off()
    await asyncio.wait_for(task, BOUND)
    assert child_cancelled == [True]
    assert (task.cancelling(), gate.statistics().http) == (0, 0)


async def test_draining_send_given_up() -> None:
    """A send made once the drain began bounds itself: given up at the cutoff with
    ConnectionClosedByDrainError, and no task is cancelled for it."""
    gate = IntakeGate()
    send = BlockedSend(passes=1)
    raised: list[type[BaseException]] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await send(START)
        gate.close()
        try:
            await send({"type": "http.response.body", "body": b"part", "more_body": True})
        except BaseException as error:
            raised.append(type(error))
            raise

    task = asyncio.ensure_future(InFlightMiddleware(app, gate=gate)(dict(SCOPE), _receive, send))
    await asyncio.wait_for(send.blocked.wait(), BOUND)
    gate.cut_off()
    await asyncio.wait_for(task, BOUND)
    assert [kind.__name__ for kind in raised] == ["ConnectionClosedByDrainError"]
    assert (task.cancelling(), gate.statistics().http) == (0, 0)


async def test_future_send_given_up() -> None:
    """A server whose ``send`` is a plain function returning a future, not a coroutine: the send
    blocked since before the drain is given up at the cutoff all the same."""
    gate = IntakeGate()
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[None]] = []

    def send(message: Message) -> asyncio.Future[None]:
        futures.append(loop.create_future())
        if len(futures) == 1:
            futures[0].set_result(None)  # the response start goes through; the body waits
        return futures[-1]

    task = asyncio.ensure_future(InFlightMiddleware(_streaming, gate=gate)(SCOPE, _receive, send))
    await until(lambda: len(futures) == 2)
    await settle()
    gate.close()
    gate.cut_off()
    await asyncio.wait_for(task, BOUND)
    assert futures[1].cancelled()
    assert (task.cancelling(), gate.statistics().http) == (0, 0)
