"""A real hypercorn server in the test's own event loop, and a raw HTTP/1.1 client for it.

``await hypercorn(app)`` (the fixture, which this package's conftest offers) serves ``app`` with
``hypercorn.asyncio.serve`` on a free loopback port until the test ends (over TLS with
``certfile=`` and ``keyfile=``), so a test can move the
gate by hand at an exact moment of the exchange.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import h11
import pytest
from hypercorn.asyncio import serve
from hypercorn.config import Config

from tests.real_servers._servers import free_port

__all__ = ["BOUND", "App", "Client", "Message", "Served", "hypercorn", "until"]

Message = dict[str, Any]
App = Callable[[Message, Any, Any], Awaitable[None]]
BOUND = 10.0  # seconds: every wait on the server or the client is bounded by this


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

    async def start(app: App, *, certfile: str | None = None, keyfile: str | None = None) -> Served:
        config = Config()
        if certfile is not None:  # TLS, with HTTP/2 offered through ALPN
            config.certfile, config.keyfile = certfile, keyfile
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


async def until(condition: Callable[[], bool]) -> None:
    """Wait, bounded, for what the server does on its own (a send to block, say)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND
    while not condition():
        assert loop.time() < deadline, "the server never got there"
        await asyncio.sleep(0.01)
