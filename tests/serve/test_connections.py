"""The lingering close and the first-byte grace of ``serve``'s connections, on real sockets (and
real uvicorn servers where an upgrade is involved)."""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.websockets.wsproto_impl import WSProtocol
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from forgezero_lifecycle.serve.connections import ConnectionStop, zero_loss_protocol
from forgezero_lifecycle.stop.server import ZeroLossServer

pytestmark = pytest.mark.anyio

#: Larger than what the kernel's buffers hold at once, so the close comes before it is all read.
RESPONSE: Final = b"x" * 400_000


class _AnswerThenClose(asyncio.Protocol):
    """Answers the first bytes with a large response, then closes at once (a ``Connection:
    close`` response while the client is still sending, say the rest of an upload)."""

    transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # the stop's transport is one too
        self.transport = transport
        self.answered = False

    def data_received(self, data: bytes) -> None:
        if not self.answered:
            self.answered = True
            self.transport.write(RESPONSE)
            self.transport.close()

    def on_response_complete(self) -> None:
        """What uvicorn's protocols have; the stop's class extends it."""


def _client_reads_everything(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(b"request" + b"y" * 1000)
        time.sleep(0.2)  # the server has answered and closed; the client still sends
        client.sendall(b"more of the upload")
        received = 0
        try:
            while chunk := client.recv(65536):
                received += len(chunk)
        except OSError as error:
            return f"{type(error).__name__} after {received} bytes"
        return f"EOF after {received} bytes"


async def _serve(factory: Callable[[], asyncio.Protocol]) -> str:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(factory, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        return await asyncio.to_thread(_client_reads_everything, port)
    finally:
        server.close()


async def test_plain_close_resets() -> None:
    """Why the lingering close exists: the kernel answers unread bytes at close with a reset."""
    outcome = await _serve(_AnswerThenClose)
    assert outcome.startswith("ConnectionResetError"), outcome


async def test_lingering_close_delivers() -> None:
    """The same server through the stop's transport: the client reads every byte, then EOF."""
    stop = ConnectionStop(first_byte_grace=1.0)
    protocol = zero_loss_protocol(_AnswerThenClose, stop)
    outcome = await _serve(protocol)
    assert outcome == f"EOF after {len(RESPONSE)} bytes"
    await asyncio.wait_for(stop.wait_lingering(), 5.0)


def test_non_uvicorn_protocol_refused() -> None:
    """The stop extends ``on_response_complete``; a protocol without it is a clear TypeError."""
    with pytest.raises(TypeError, match="not a uvicorn protocol"):
        zero_loss_protocol(asyncio.Protocol, ConnectionStop(first_byte_grace=1.0))


async def _until(condition: Callable[[], bool]) -> None:
    """Wait, bounded (10 s), for what the server does on its own."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the server never got there")


@contextlib.asynccontextmanager
async def _served(
    app: Callable[..., Any], first_byte_grace: float, **config: Any
) -> AsyncIterator[tuple[uvicorn.Server, int, ConnectionStop]]:
    """A real uvicorn server of ``app`` on a loopback port with the zero-loss protocol, started;
    stopped on the way out."""
    loaded = uvicorn.Config(app, lifespan="off", **config)
    loaded.load()
    stop = ConnectionStop(first_byte_grace=first_byte_grace)
    loaded.http_protocol_class = zero_loss_protocol(loaded.http_protocol_class, stop)
    server = uvicorn.Server(loaded)
    listener = socket.create_server(("127.0.0.1", 0))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        await _until(lambda: server.started)
        yield server, listener.getsockname()[1], stop
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 15)
        listener.close()


async def _echo(scope: Scope, receive: Receive, send: Send) -> None:
    """A WebSocket echo (what the sessions of tests/serve/test_handover.py talk to)."""
    assert scope["type"] == "websocket"
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    while (message := await receive())["type"] == "websocket.receive":
        await send({"type": "websocket.send", "text": message["text"]})


#: "auto" is uvicorn's default WebSocket protocol: websockets' sans-I/O one today, its legacy one
#: under the uvicorn of ``make test-oldest``.
@pytest.mark.parametrize("ws", ["auto", "wsproto"])
# The legacy protocol of make test-oldest's uvicorn (0.30) hands websockets a two-argument
# handler, which websockets 14 and later accept with this warning (a subprocess never shows it).
@pytest.mark.filterwarnings("ignore:remove second argument of ws_handler:DeprecationWarning")
@pytest.mark.parametrize("http", ["h11", "httptools"])
async def test_upgrade_in_the_first_byte_grace_keeps_its_session(http: str, ws: str) -> None:
    """A connection idle when a handover stop began whose first request is a WebSocket upgrade:
    the session it became outlives the first-byte grace (which ended the connection under it,
    without a close frame, when the grace closed the HTTP protocol uvicorn had left behind)."""
    grace = 0.3
    config = uvicorn.Config(
        _echo, http=http, ws=ws, lifespan="off", log_level="warning", ws_ping_interval=None
    )
    config.load()
    stop = ConnectionStop(first_byte_grace=grace)
    config.http_protocol_class = zero_loss_protocol(config.http_protocol_class, stop)
    server = uvicorn.Server(config)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        await _until(lambda: server.started)
        client = socket.create_connection(("127.0.0.1", port))
        client.setblocking(False)
        connections = server.server_state.connections
        await _until(lambda: bool(connections))  # accepted: idle, no request yet
        stop.begin(connections, websockets=False)  # what a handover does at the signal
        async with connect(f"ws://127.0.0.1:{port}/", sock=client, proxy=None) as session:
            await asyncio.sleep(grace + 0.5)
            await session.send("still here")
            assert await asyncio.wait_for(session.recv(), 5) == "still here"
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)
        listener.close()


class _CloseNeverCompletes(WSProtocol):
    """uvicorn's wsproto session, except that the stop's close notice is lost: it stands in for
    a session whose close never completes, seen from outside under ``serve`` (a stop that waited
    out the 15 s graceful timeout for one such connection) and not reproduced with a real
    client, so the fault is made here on demand."""

    def shutdown(self) -> None:
        pass


async def _waits_for_disconnect(scope: Scope, receive: Receive, send: Send) -> None:
    assert scope["type"] == "websocket"
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    while (await receive())["type"] != "websocket.disconnect":
        pass


async def test_stop_aborts_a_connection_it_cannot_close(caplog: pytest.LogCaptureFixture) -> None:
    """A connection with no response under way still open at the stop's bound (first-byte
    grace, lingering close, a second) is aborted and named: the exit does not wait for it until
    uvicorn's graceful timeout (30 s here)."""
    config = uvicorn.Config(
        _waits_for_disconnect,
        ws=_CloseNeverCompletes,
        lifespan="off",
        log_level="warning",
        ws_ping_interval=None,
        timeout_graceful_shutdown=30,
    )
    config.load()
    stop = ConnectionStop(first_byte_grace=0.3)
    config.http_protocol_class = zero_loss_protocol(config.http_protocol_class, stop)
    server = ZeroLossServer(config, stop, shared_listener=False)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        await _until(lambda: server.started)
        async with connect(f"ws://127.0.0.1:{port}/", proxy=None) as session:
            server.should_exit = True
            began = time.monotonic()
            # Bounded well under the graceful timeout: the stop's bound is 3.3 s here.
            await asyncio.wait_for(asyncio.shield(serving), 15)
            stopped_after = time.monotonic() - began
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(session.recv(), 5)
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 40)
        listener.close()
    assert stopped_after < stop.bound + 5, stopped_after  # 5 s of slack for a loaded machine
    assert "stop.overdue_connections aborted=1 kinds=_CloseNeverCompletes:1" in caplog.text


async def _hello(scope: Scope, receive: Receive, send: Send) -> None:
    assert scope["type"] == "http"
    headers = [(b"content-length", b"5")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"hello"})


@pytest.mark.parametrize("http", ["h11", "httptools"])
async def test_idle_close_spares_a_request_not_read_yet(http: str) -> None:
    """The first-byte grace ends on a connection whose request is in the kernel's buffer but
    not read yet (the event loop lags, as on a loaded machine): the request is answered, and the
    connection closes after it, instead of being closed under the client (lost)."""
    # A grace of 30 s: its end is called below.
    async with _served(_hello, 30.0, http=http, log_level="warning") as (server, port, stop):
        client = socket.create_connection(("127.0.0.1", port))
        connections = server.server_state.connections
        await _until(lambda: bool(connections))
        (protocol,) = connections
        stop.begin(connections)
        # On loopback the bytes are in the server's receive buffer once sendall returns; no
        # await follows, so the loop has not read them when the grace's end comes.
        client.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        stop.close_if_idle(protocol)
        client.settimeout(10)
        answer = await asyncio.to_thread(_read_to_eof, client)
        client.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert answer.endswith(b"\r\n\r\nhello"), answer  # whole, then closed: read to EOF


def _read_to_eof(client: socket.socket) -> bytes:
    received = b""
    while chunk := client.recv(65536):
        received += chunk
    return received


@pytest.mark.parametrize("http", ["h11", "httptools"])
async def test_handover_waits_for_a_request_not_read_yet(http: str) -> None:
    """A handover's wait for its connections to move over (what the drain waits for before it
    closes intake) ends only once a request that arrived on an idle connection, but that the
    lagging loop has not read yet, is the app's: admitted, never refused by the drain."""
    intake_closed = False

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        status = 503 if intake_closed else 200  # what the runtime's gate decides at admission
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    # A grace of 30 s: its end is called below.
    async with _served(app, 30.0, http=http, log_level="warning") as (server, port, stop):
        client = socket.create_connection(("127.0.0.1", port))
        connections = server.server_state.connections
        await _until(lambda: bool(connections))
        (protocol,) = connections
        stop.begin(connections, websockets=False)  # a handover
        moved = asyncio.create_task(stop.wait_moved())
        client.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        stop.close_if_idle(protocol)  # the grace ends before the loop read the request
        await asyncio.wait_for(moved, 10)
        intake_closed = True  # the drain closes intake as soon as the wait is over
        client.settimeout(10)
        answer = await asyncio.to_thread(_read_to_eof, client)
        client.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer


async def test_handover_wait_ends_when_idle_connections_close() -> None:
    """A connection that stays silent through the first-byte grace is closed (after the
    refusal a request crossing the close would read), and the handover's wait ends with it (it
    does not wait for the drain's deadline)."""
    async with _served(_hello, 0.2, log_level="warning") as (server, port, stop):
        client = socket.create_connection(("127.0.0.1", port))
        connections = server.server_state.connections
        await _until(lambda: bool(connections))
        stop.begin(connections, websockets=False)
        await asyncio.wait_for(stop.wait_moved(), 10)
        client.settimeout(10)
        closed = await asyncio.to_thread(_read_to_eof, client)  # by the grace's end: EOF
        client.close()
    assert closed.startswith(b"HTTP/1.1 503 "), closed


def _read_one_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """One whole answer of ``_hello``'s length (5), and whatever came after it in the same
    reads (what the server wrote next, before the client asked again)."""
    received = b""
    while b"\r\n\r\n" not in received or len(received.partition(b"\r\n\r\n")[2]) < 5:
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n" + rest[:5], rest[5:]


def _send_after_the_close(port: int, *, first: bytes) -> tuple[bytes, bytes]:
    """A client whose request crosses the server's close: it sends ``first`` (if any) and reads
    its answer, waits until the server has closed the idle connection (its bytes are readable),
    then sends a request without looking (a pooled connection taken just before the FIN came)
    and reads to EOF. Returns the first answer and what the crossing request got."""
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.settimeout(10)
        answer = b""
        early = b""
        if first:
            client.sendall(first)
            answer, early = _read_one_answer(client)
        if not early:
            readable, _, _ = select.select([client], [], [], 10)
            assert readable, "the server never closed the idle connection"
        client.sendall(b"GET /crossing HTTP/1.1\r\nhost: x\r\n\r\n")
        return answer, early + _read_to_eof(client)


@pytest.mark.parametrize("used", [True, False], ids=["kept-alive", "fresh"])
@pytest.mark.parametrize("http", ["h11", "httptools"])
async def test_request_crossing_the_idle_close_is_refused(http: str, used: bool) -> None:
    """The first-byte grace ends on a silent connection just as its client sends (the race of
    every keep-alive close): the client reads a 503 refusal, with ``Connection: close``, as
    its answer (safe to retry: the app never saw the request), not a bare disconnect (lost)."""
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["path"])
        await _hello(scope, receive, send)

    async with _served(app, 0.2, http=http, log_level="warning") as (server, port, stop):
        first = b"GET /first HTTP/1.1\r\nhost: x\r\n\r\n" if used else b""
        client = asyncio.create_task(asyncio.to_thread(_send_after_the_close, port, first=first))
        connections = server.server_state.connections
        await _until(lambda: bool(connections) and (not used or seen == ["/first"]))
        stop.begin(connections)
        answer, crossing = await asyncio.wait_for(client, 15)
    assert answer.endswith(b"hello") if used else answer == b""
    head, _, body = crossing.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 "), crossing
    assert b"connection: close" in head.lower(), crossing
    assert b"x-forgezero-refusal: connection-closed" in head.lower(), crossing
    assert body == b'{"error":"RUNTIME_DRAINING"}', crossing
    assert seen == (["/first"] if used else [])  # the crossing request never reached the app


class _GoneTransport(asyncio.Transport):
    """A transport whose client reset the connection before the server's loop read the reset:
    ``shutdown(SHUT_WR)`` then fails with ENOTCONN. Seen from outside (uvicorn logging
    "Exception in ASGI application" at a close) but not reproduced on demand with a real socket
    (the loop reads the reset first), so the transport is made to fail here."""

    def __init__(self) -> None:
        super().__init__()
        self.aborted = False
        self.protocol: asyncio.BaseProtocol | None = None

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        raise OSError(107, "Transport endpoint is not connected")

    def abort(self) -> None:
        self.aborted = True
        if self.protocol is not None:
            self.protocol.connection_lost(None)


async def test_linger_on_a_reset_connection_aborts_quietly() -> None:
    """The lingering close of a connection its client has reset does not raise into the code
    that closed it: the transport is aborted, and the close is over."""
    stop = ConnectionStop(first_byte_grace=1.0)
    transport = _GoneTransport()
    lost: list[Exception | None] = []

    class Owner(asyncio.Protocol):
        def connection_lost(self, exc: Exception | None) -> None:
            lost.append(exc)

    stop.linger(transport, Owner())
    await asyncio.wait_for(stop.wait_lingering(), 5)
    await asyncio.sleep(0)  # the owner is told on the next turn
    assert transport.aborted
    assert lost == [None]


@pytest.mark.parametrize("http", ["h11", "httptools"])
async def test_request_crossing_the_close_after_a_started_response_is_refused(http: str) -> None:
    """A response that started before the stop cannot carry ``Connection: close``: its client
    keeps the connection and may send its next request at once, crossing the close that follows
    the response. That request reads a 503 refusal as its answer, not a bare disconnect."""
    release = asyncio.Event()
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["path"])
        headers = [(b"content-length", b"5")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await release.wait()
        await send({"type": "http.response.body", "body": b"hello"})

    def client() -> tuple[bytes, bytes]:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.settimeout(10)
            sock.sendall(b"GET /first HTTP/1.1\r\nhost: x\r\n\r\n")
            answer, early = _read_one_answer(sock)
            sock.sendall(b"GET /crossing HTTP/1.1\r\nhost: x\r\n\r\n")  # kept alive, it thinks
            return answer, early + _read_to_eof(sock)

    async with _served(app, 30.0, http=http, log_level="warning") as (server, port, stop):
        reading = asyncio.create_task(asyncio.to_thread(client))
        await _until(lambda: seen == ["/first"])
        stop.begin(server.server_state.connections)  # the response has started
        release.set()
        answer, crossing = await asyncio.wait_for(reading, 15)
    assert b"connection: close" not in answer.lower(), answer  # it had started: no header
    assert crossing.startswith(b"HTTP/1.1 503 "), crossing
    assert crossing.endswith(b'{"error":"RUNTIME_DRAINING"}'), crossing
    assert seen == ["/first"]


@pytest.mark.parametrize("http", ["h11", "httptools"])
async def test_response_cut_after_the_stop_gets_no_refusal(http: str) -> None:
    """A response under way when the stop began that its app then ends short (it raises after
    part of a Content-Length body): the close that follows writes nothing after the part, so
    the client sees the cut (no refusal read as the rest of the body)."""
    release = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-length", b"100")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        await release.wait()
        raise RuntimeError("the app fails halfway")

    def client() -> bytes:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.settimeout(10)
            sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            return _read_to_eof(sock)

    async with _served(app, 30.0, http=http, log_level="critical") as (server, port, stop):
        reading = asyncio.create_task(asyncio.to_thread(client))
        await _until(lambda: any(c.cycle is not None for c in server.server_state.connections))
        await _until(lambda: all(c.cycle.response_started for c in server.server_state.connections))
        stop.begin(server.server_state.connections)
        release.set()
        answer = await asyncio.wait_for(reading, 15)
    assert answer.endswith(b"\r\n\r\npart"), answer  # the cut shows: 4 of 100 bytes, then EOF
