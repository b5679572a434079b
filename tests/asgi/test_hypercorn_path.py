"""InFlightMiddleware under a real hypercorn server in this process: raw bytes over loopback.

An HTTP/1 request admitted while serving gets hypercorn's own ``receive`` and ``send`` (nothing
wrapped); the drain must still reach it through hypercorn's ``HTTPStream``. Each test serves
its app with ``hypercorn.asyncio.serve`` in the test's own event loop and moves the gate by
hand, from inside the app or between the client's steps, so the moment the drain begins is
exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import h11
import httpx
import pytest
from hypercorn.asyncio import serve
from hypercorn.config import Config

from forgezero_lifecycle import ConnectionClosedByDrainError
from forgezero_lifecycle.asgi import _hypercorn
from forgezero_lifecycle.asgi.middleware import InFlightMiddleware
from forgezero_lifecycle.core.gate import IntakeGate
from forgezero_lifecycle.testing import settle
from tests.server._servers import free_port

pytestmark = pytest.mark.anyio

Message = dict[str, Any]
App = Callable[[Message, Any, Any], Awaitable[None]]
BOUND = 10.0  # seconds: every wait on the server or the client is bounded by this


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # hypercorn.asyncio runs on asyncio only


class Client:
    """One raw HTTP/1.1 connection, parsed with h11."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)

    async def request(
        self, method: str = "GET", target: str = "/", body: bytes | None = None, end: bool = True
    ) -> None:
        headers = [("Host", "test")]
        if body is not None:
            headers.append(("Content-Length", str(len(body) if end else len(body) * 2)))
        data = self.h11.send(h11.Request(method=method, target=target, headers=headers))
        if body:
            data += self.h11.send(h11.Data(data=body))
        if end:
            data += self.h11.send(h11.EndOfMessage())
        self.writer.write(data)
        await self.writer.drain()

    async def send_rest(self, body: bytes) -> None:
        self.writer.write(self.h11.send(h11.Data(data=body)) + self.h11.send(h11.EndOfMessage()))
        await self.writer.drain()

    async def event(self) -> Any:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.h11.receive_data(await asyncio.wait_for(self.reader.read(65536), BOUND))

    async def head(self) -> h11.Response:
        event = await self.event()
        assert isinstance(event, h11.Response), event
        return event

    async def rest(self) -> bytes:
        """The body up to its end; raises if the connection ends the body early."""
        body = b""
        while True:
            event = await self.event()
            if isinstance(event, h11.EndOfMessage):
                return body
            assert isinstance(event, h11.Data), event
            body += event.data

    async def closed(self) -> bool:
        """Whether the server closes the connection (read to the end)."""
        return await asyncio.wait_for(self.reader.read(), BOUND) == b""


class Served:
    """The address of a hypercorn server running one app in this event loop."""

    def __init__(self, port: int, clients: list[Client]) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._clients = clients

    async def connect(self, receive_buffer: int | None = None) -> Client:
        if receive_buffer is None:
            client = Client(*await asyncio.open_connection("127.0.0.1", self.port))
        else:
            raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)  # before connect
            raw.setblocking(False)
            await asyncio.get_running_loop().sock_connect(raw, ("127.0.0.1", self.port))
            client = Client(*await asyncio.open_connection(sock=raw))
        self._clients.append(client)
        return client


@pytest.fixture
async def hypercorn() -> AsyncIterator[Callable[[App], Awaitable[Served]]]:
    """``await hypercorn(app)``: serve ``app`` on a free loopback port until the test ends."""
    running: list[tuple[asyncio.Event, asyncio.Task[None]]] = []
    clients: list[Client] = []

    async def start(app: App) -> Served:
        config = Config()
        port = free_port()
        config.bind = [f"127.0.0.1:{port}"]
        config.graceful_timeout = 1.0
        stop = asyncio.Event()
        task = asyncio.ensure_future(serve(_with_lifespan(app), config, shutdown_trigger=stop.wait))
        running.append((stop, task))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BOUND
        while True:  # until it listens
            try:
                _, probe = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                assert loop.time() < deadline, "hypercorn did not listen in time"
                await asyncio.sleep(0.01)
            else:
                probe.close()
                await probe.wait_closed()
                return Served(port, clients)

    yield start
    for client in clients:
        client.writer.close()
        with contextlib.suppress(OSError):  # reset by a server that gave the connection up
            await client.writer.wait_closed()
    for stop, task in running:
        stop.set()
        await asyncio.wait_for(task, BOUND)


def _with_lifespan(app: App) -> App:
    """``app`` with the lifespan hypercorn runs first answered here."""

    async def served(scope: Message, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while True:
            message = await receive()
            kind = message["type"].removeprefix("lifespan.")
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return

    return served


async def _read_to_disconnect_then_answer(
    receive: Any, send: Any, read: list[Message], each: Callable[[], object] = lambda: None
) -> None:
    """An app's body: every message up to the disconnect into ``read`` (``each`` after every
    one), then a 200 ``done``."""
    while True:
        message = await receive()
        read.append(message)
        each()
        if message["type"] == "http.disconnect":
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"done"})


async def until(condition: Callable[[], bool]) -> None:
    """Wait, bounded, for what the server does on its own (a send to block, say)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND
    while not condition():
        assert loop.time() < deadline, "the server never got there"
        await asyncio.sleep(0.01)


async def test_an_http1_request_gets_the_servers_own_receive_and_send(hypercorn: Any) -> None:
    """Nothing is wrapped while no drain has begun: the app is handed hypercorn's stream's
    ``app_send`` and its app queue's ``get``, and the request is counted while it runs."""
    gate = IntakeGate()
    seen: list[Any] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        seen.extend([type(send.__self__).__name__, type(receive.__self__), gate.statistics().http])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    client = await served.connect()
    await client.request()
    assert (await client.head()).status_code == 200
    assert await client.rest() == b"ok"
    assert seen == ["HTTPStream", asyncio.Queue, 1]
    assert gate.statistics().http == 0


async def test_an_http2_request_is_wrapped_and_its_answer_has_no_connection_header(
    hypercorn: Any,
) -> None:
    """An HTTP/2 stream shares its connection with others: it is wrapped, and a response it
    starts during a drain comes whole, without the ``connection`` header HTTP/2 forbids."""
    gate = IntakeGate()
    owners: list[str] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        owners.append(type(getattr(send, "__self__", None)).__name__)
        gate.begin_draining()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    async with httpx.AsyncClient(http1=False, http2=True, timeout=BOUND) as client:
        response = await client.get(served.url + "/")
    assert (response.http_version, response.status_code, response.content) == (
        "HTTP/2",
        200,
        b"ok",
    )
    assert "connection" not in response.headers
    assert owners == ["_HttpResponder"]


async def test_a_drain_begun_right_after_admission_still_closes_the_response(
    hypercorn: Any,
) -> None:
    """Admitted one step before the drain begins, the response still says Connection: close
    and the connection is closed after it."""
    gate = IntakeGate()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        gate.begin_draining()  # the first thing after admission, before any await
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    client = await served.connect()
    await client.request()
    head = await client.head()
    assert (b"connection", b"close") in head.headers
    assert await client.rest() == b"ok"
    assert await client.closed()


@pytest.mark.parametrize("waiting", [True, False], ids=["waiting-at-notice", "receive-later"])
async def test_a_receive_after_the_body_gets_the_disconnect_and_the_stream_ends_cleanly(
    hypercorn: Any, waiting: bool
) -> None:
    """Whether the stream waits on receive() at the notice or calls it later, it gets
    http.disconnect, its unfinished chunked response ends with an empty last chunk, and the
    connection stays usable."""
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

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    client = await served.connect()
    await client.request()
    head = await client.head()
    assert (await client.event()).data == b"part"
    await settle()
    gate.close()
    gate.end_streams()
    later.set()
    assert await client.rest() == b""  # the empty last chunk: a truncated body raises here
    assert got == [{"type": "http.disconnect"}]
    assert (b"connection", b"close") not in head.headers  # started before the drain
    client.h11.start_next_cycle()
    await client.request()  # the same connection: refused, since the gate is closed
    again = await client.head()
    assert again.status_code == 503
    assert gate.statistics().http == 0


async def test_a_body_still_coming_at_the_notice_is_read_whole_before_the_disconnect(
    hypercorn: Any,
) -> None:
    """The disconnect follows the last part of the body into the app queue, never ahead of
    it: a request still uploading at the notice reads all it sends."""
    gate = IntakeGate()
    read: list[Message] = []
    first_part = asyncio.Event()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await _read_to_disconnect_then_answer(receive, send, read, each=first_part.set)

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    client = await served.connect()
    await client.request("POST", body=b"front", end=False)
    await asyncio.wait_for(first_part.wait(), BOUND)
    gate.close()
    gate.end_streams()
    await client.send_rest(b"back!")
    head = await client.head()
    assert await client.rest() == b"done"
    body = b"".join(message.get("body", b"") for message in read)
    assert body == b"frontback!"
    assert [m["type"] for m in read][-1] == "http.disconnect"
    assert [m.get("more_body") for m in read[:-1]][-1] is False
    assert (b"connection", b"close") in head.headers


async def test_a_body_that_fills_the_app_queue_is_read_whole_before_the_disconnect(
    hypercorn: Any,
) -> None:
    """A body that fills hypercorn's app queue, unread at the notice (its end waits for room
    in the queue): the app still reads every part, then the disconnect."""
    gate = IntakeGate()
    told = asyncio.Event()
    read: list[Message] = []
    parts = [b"%02d" % index for index in range(10)]  # the queue holds 10: the end waits

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await told.wait()
        await _read_to_disconnect_then_answer(receive, send, read)

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    client = await served.connect()
    chunked = b"".join(b"2\r\n" + part + b"\r\n" for part in parts) + b"0\r\n\r\n"
    head = b"POST / HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
    client.writer.write(head + chunked)
    await client.writer.drain()
    await until(lambda: gate.statistics().http == 1)
    await settle()
    gate.close()
    gate.end_streams()
    told.set()
    # The request went out as raw bytes: tell the client's h11 of it, to read the answer.
    client.h11.send(h11.Request(method="POST", target="/", headers=[("Host", "test")]))
    assert (await client.head()).status_code == 200
    assert await client.rest() == b"done"
    assert b"".join(m.get("body", b"") for m in read) == b"".join(parts)
    assert [m["type"] for m in read][-1] == "http.disconnect"
    assert read[-2]["more_body"] is False


async def test_an_answer_computed_across_the_notice_is_sent_whole(hypercorn: Any) -> None:
    """A request that read its body and does not wait on receive() is not told to stop."""
    gate = IntakeGate()
    ready = asyncio.Event()
    read = asyncio.Event()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        body = (await receive())["body"]
        read.set()
        await ready.wait()
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    client = await served.connect()
    await client.request("POST", body=b"payload")
    await asyncio.wait_for(read.wait(), BOUND)
    gate.close()
    gate.end_streams()
    ready.set()
    head = await client.head()
    assert (b"connection", b"close") in head.headers
    assert await client.rest() == b"payload"
    assert await client.closed()
    assert gate.statistics().http == 0


async def test_a_send_blocked_at_the_cutoff_is_given_up_and_the_connection_abandoned(
    hypercorn: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The blocked send is let go, the next one raises ConnectionClosedByDrainError (an OSError),
    the app's error stays inside, the connection is aborted and the count released."""
    gate = IntakeGate()
    raised: list[BaseException] = []
    streams: list[Any] = []
    chunk = b"x" * 65536

    async def app(scope: Message, receive: Any, send: Any) -> None:
        streams.append(_stream_of(send))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            # Far more than the socket buffers hold; bounded, so a send that neither blocks nor
            # raises (a regression) ends the test instead of spinning forever.
            for _ in range(2000):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except OSError as error:
            raised.append(error)
            raise

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    client = await served.connect(receive_buffer=4096)
    await client.request()  # and never read

    def blocked() -> bool:  # hypercorn's writer waits for the client to read
        return bool(streams) and streams[0].send.__self__.send.__self__.writer._protocol._paused

    await until(blocked)
    gate.close()
    gate.end_streams()
    await settle()
    assert gate.statistics().http == 1
    with caplog.at_level(logging.WARNING):
        gate.cut_off()
        await until(lambda: gate.statistics().http == 0)
    assert [type(error) for error in raised] == [ConnectionClosedByDrainError]
    assert [r.getMessage() for r in caplog.records if r.name.startswith("forgezero")] == [
        "drain.connection_abandoned kind=http"
    ]
    assert streams[0].closed


def _stream_of(send: Any) -> Any:
    """The hypercorn stream behind the ``send`` an app was handed, wrapped or not."""
    owner = send.__self__
    if type(owner).__name__ == "_HttpResponder":
        owner = owner._send.__self__  # the wrapped path's own server send
    return owner


async def test_an_app_that_fails_after_the_notice_still_gets_hypercorns_error_answer(
    hypercorn: Any,
) -> None:
    """The disconnect told to the app is the middleware's: hypercorn still answers the app's
    failure with its 500 to the client, still there."""
    gate = IntakeGate()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        if (await receive())["type"] == "http.disconnect":
            raise RuntimeError("the app's own failure after the notice")

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    client = await served.connect()
    await client.request()
    await settle()
    gate.close()
    gate.end_streams()
    assert (await client.head()).status_code == 500
    assert gate.statistics().http == 0


async def test_only_a_stream_with_all_the_path_uses_takes_it(
    hypercorn: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hypercorn stream qualifies; one whose class lacks what a drain moment uses (as if it
    had been renamed) does not, and is served by the wrapped path."""
    monkeypatch.setattr(_hypercorn, "KNOWN_STREAMS", {})
    streams: list[Any] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        streams.append(send.__self__)
        assert _hypercorn.learn(send.__self__) is True
        changed = type("HTTPStream", (), {"__module__": type(send.__self__).__module__})()
        vars(changed).update(vars(send.__self__))
        del changed.app_put
        assert _hypercorn.learn(changed) is False
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    served = await hypercorn(app)
    client = await served.connect()
    await client.request()
    assert (await client.head()).status_code == 200
    assert len(streams) == 1
