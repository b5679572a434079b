"""The lingering close and the first-byte grace of ``serve``'s connections, on real sockets."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Final

import pytest

from forgezero_lifecycle.serve.connections import ConnectionStop, zero_loss_protocol

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
