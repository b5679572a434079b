"""A hostile handoff source on loopback: each path misbehaves in one way, and it counts bytes.

It speaks raw HTTP/1.1 over asyncio streams (no framework that would tidy the misbehaviour up)
and records, per mode, how many connections it got, how many body bytes it managed to write
before the client gave up, and whether the client closed the connection.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Final

__all__ = ["BOMB_INFLATED_BYTES", "MODES", "HostileSource"]

#: One gzip member of 16 MiB of zeros, sent 64 times: ~1 MiB on the wire, 1 GiB inflated.
_MEMBER_BYTES: Final = 16 * 1024 * 1024
_MEMBERS: Final = 64
BOMB_INFLATED_BYTES: Final = _MEMBER_BYTES * _MEMBERS
#: The endless body stops by itself after this much (a client that never stops reading fails).
ENDLESS_CAP: Final = 256 * 1024 * 1024
_HEAD_LIMIT: Final = 64 * 1024
_ENVELOPE_START: Final = b'{"protocol":"tests.reliability.served","schemaVersion":1,"cursor":"x",'

Writer = asyncio.StreamWriter


class HostileSource:
    """``http://127.0.0.1:<port>/<mode>`` misbehaves as ``mode`` says (see :data:`MODES`)."""

    def __init__(self) -> None:
        self.connections: Counter[str] = Counter()
        self.body_bytes_sent: Counter[str] = Counter()
        self.client_closed: Counter[str] = Counter()
        self.redirect_target = "http://127.0.0.1:9/"
        self._server: asyncio.Server | None = None
        self._writers: set[Writer] = set()
        member = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        self._bomb_member = member.compress(bytes(_MEMBER_BYTES)) + member.flush()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: Writer) -> None:
        mode = "?"
        self._writers.add(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > _HEAD_LIMIT:
                return
            target = head.split(b" ", 2)[1].decode("ascii", "replace")
            mode = target.split("?", 1)[0].strip("/")
            self.connections[mode] += 1
            behaviour = _BEHAVIOURS.get(mode)
            if behaviour is not None:
                await behaviour(self, reader, writer, mode)
        except ConnectionError:
            self.client_closed[mode] += 1  # it hung up while we were still writing
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _until_client_closes(self, reader: asyncio.StreamReader, mode: str) -> None:
        """Wait (bounded) for the client to hang up, and record that it did."""
        try:
            async with asyncio.timeout(30):
                while await reader.read(65536):
                    pass
        except TimeoutError:
            return
        self.client_closed[mode] += 1

    async def _write_body(self, writer: Writer, mode: str, data: bytes) -> None:
        writer.write(data)
        await writer.drain()
        self.body_bytes_sent[mode] += len(data)


async def _stall_headers(
    source: HostileSource, reader: asyncio.StreamReader, writer: Writer, mode: str
) -> None:
    await source._until_client_closes(reader, mode)


async def _stall_body(
    source: HostileSource, reader: asyncio.StreamReader, writer: Writer, mode: str
) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 3000\r\n\r\n"
    )
    await source._write_body(writer, mode, _ENVELOPE_START)
    await source._until_client_closes(reader, mode)


async def _gzip_bomb(
    source: HostileSource, reader: asyncio.StreamReader, writer: Writer, mode: str
) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    member = source._bomb_member
    for _ in range(_MEMBERS):
        await source._write_body(writer, mode, b"%x\r\n%s\r\n" % (len(member), member))
    await source._write_body(writer, mode, b"0\r\n\r\n")
    await source._until_client_closes(reader, mode)


async def _length_huge(
    source: HostileSource, reader: asyncio.StreamReader, writer: Writer, mode: str
) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
    )
    await source._write_body(writer, mode, _ENVELOPE_START)
    await source._until_client_closes(reader, mode)


async def _length_long(
    source: HostileSource, reader: asyncio.StreamReader, writer: Writer, mode: str
) -> None:
    """Announces 3000 bytes (within the limit), sends 70 and closes: a truncated body."""
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 3000\r\n\r\n"
    )
    await source._write_body(writer, mode, _ENVELOPE_START)


async def _length_short(
    source: HostileSource, reader: asyncio.StreamReader, writer: Writer, mode: str
) -> None:
    """Announces 10 bytes and sends a whole (longer) document: the first 10 are not JSON."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n")
    await source._write_body(writer, mode, _ENVELOPE_START + b'"value":{}}')
    await source._until_client_closes(reader, mode)


async def _endless(
    source: HostileSource, reader: asyncio.StreamReader, writer: Writer, mode: str
) -> None:
    """A chunked body of JSON whitespace that never ends (until the client hangs up)."""
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b" " * 16384
    framed = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    while source.body_bytes_sent[mode] < ENDLESS_CAP:
        await source._write_body(writer, mode, framed)


async def _redirect(
    source: HostileSource, reader: asyncio.StreamReader, writer: Writer, mode: str
) -> None:
    status = mode.rsplit("-", 1)[1]
    location = source.redirect_target if "loopback" in mode else "http://169.254.169.254/latest/"
    writer.write(
        f"HTTP/1.1 {status} Moved\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode()
    )
    await writer.drain()
    await source._until_client_closes(reader, mode)


async def _close_early(
    source: HostileSource, reader: asyncio.StreamReader, writer: Writer, mode: str
) -> None:
    return  # the handler closes the connection without a byte


async def _close_mid_headers(
    source: HostileSource, reader: asyncio.StreamReader, writer: Writer, mode: str
) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Le")
    await writer.drain()


async def _reset(
    source: HostileSource, reader: asyncio.StreamReader, writer: Writer, mode: str
) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST


Behaviour = Callable[[HostileSource, asyncio.StreamReader, Writer, str], Awaitable[None]]

_BEHAVIOURS: Final[dict[str, Behaviour]] = {
    "stall-headers": _stall_headers,
    "stall-body": _stall_body,
    "gzip-bomb": _gzip_bomb,
    "length-huge": _length_huge,
    "length-long": _length_long,
    "length-short": _length_short,
    "endless": _endless,
    "redirect-loopback-302": _redirect,
    "redirect-external-307": _redirect,
    "close-early": _close_early,
    "close-mid-headers": _close_mid_headers,
    "reset": _reset,
}

#: Each mode and the failure it must end in.
MODES: Final = {
    "stall-headers": "RUNTIME_STATE_TIMEOUT",
    "stall-body": "RUNTIME_STATE_TIMEOUT",
    "gzip-bomb": "RUNTIME_STATE_SOURCE_TOO_LARGE",
    "length-huge": "RUNTIME_STATE_SOURCE_TOO_LARGE",
    "length-long": "RUNTIME_STATE_SOURCE_UNREACHABLE",
    "length-short": "RUNTIME_STATE_ENVELOPE_INVALID",
    "endless": "RUNTIME_STATE_SOURCE_TOO_LARGE",
    "redirect-loopback-302": "RUNTIME_STATE_SOURCE_HTTP_302",
    "redirect-external-307": "RUNTIME_STATE_SOURCE_HTTP_307",
    "close-early": "RUNTIME_STATE_SOURCE_UNREACHABLE",
    "close-mid-headers": "RUNTIME_STATE_SOURCE_UNREACHABLE",
    "reset": "RUNTIME_STATE_SOURCE_UNREACHABLE",
}
