"""The private control channel between the supervisor and one worker process.

A stream socket pair (the worker inherits one end), carrying length-prefixed orjson messages:
a 4-byte big-endian length, then one JSON object. Three kinds of message::

    {"id": 7, "op": "begin", ...}      a request; the other side answers it
    {"re": 7, ...}                     the answer to request 7
    {"event": "state", ...}            a one-way notice

Either side may send requests. End of file means the other process is gone; nothing else on the
channel is trusted more than the process on the other end (both are ours).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any, Final, final

import orjson

__all__ = ["MAX_MESSAGE_BYTES", "Channel", "ChannelClosedError", "Handler", "read_frame_blocking"]

logger = logging.getLogger("forgezero_lifecycle.serve.channel")

_HEADER: Final = struct.Struct("!I")
#: A state envelope is at most 1 MiB; its JSON escaping may grow it.
MAX_MESSAGE_BYTES: Final = 8 * 1024 * 1024

Message = dict[str, Any]
#: Answers a request (returns the answer's fields) or takes an event (returns None).
Handler = Callable[[Message], Awaitable[Message | None]]


class ChannelClosedError(ConnectionError):
    """The process on the other end is gone (end of file, or the channel was closed)."""


def encode(message: Message) -> bytes:
    body = orjson.dumps(message)
    return _HEADER.pack(len(body)) + body


def read_frame_blocking(sock: socket.socket) -> Message:
    """Read one message without an event loop (the worker's configuration, before it starts)."""
    header = _recv_exactly(sock, _HEADER.size)
    (length,) = _HEADER.unpack(header)
    if length > MAX_MESSAGE_BYTES:
        raise ChannelClosedError(f"a {length}-byte message is over the limit")
    message = orjson.loads(_recv_exactly(sock, length))
    if not isinstance(message, dict):
        raise ChannelClosedError("a message is not a JSON object")
    return message


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ChannelClosedError("end of file")
        data += chunk
    return bytes(data)


@final
class Channel:
    """One end of the channel, on an asyncio loop: requests, answers and events."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._handler = handler
        self._next_id = 0
        self._waiting: dict[int, asyncio.Future[Message]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = asyncio.Event()
        self._reading: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, sock: socket.socket, handler: Handler) -> Channel:
        reader, writer = await asyncio.open_connection(sock=sock, limit=MAX_MESSAGE_BYTES)
        channel = cls(reader, writer, handler)
        channel._reading = asyncio.create_task(channel._read_loop())
        return channel

    def notify(self, message: Message) -> None:
        """Send a one-way message (an event, or an initial configuration)."""
        if self.closed.is_set():
            return
        self._writer.write(encode(message))

    async def request(self, op: str, timeout: float = 10.0, **fields: Any) -> Message:
        """Send request ``op`` and wait (bounded) for its answer."""
        if self.closed.is_set():
            raise ChannelClosedError("the channel is closed")
        self._next_id += 1
        number = self._next_id
        answer: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiting[number] = answer
        try:
            self._writer.write(encode({"id": number, "op": op, **fields}))
            async with asyncio.timeout(timeout):
                return await answer
        finally:
            self._waiting.pop(number, None)

    async def aclose(self) -> None:
        self._shut()
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading

    def _shut(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            self._writer.close()
        for answer in self._waiting.values():
            if not answer.done():
                answer.set_exception(ChannelClosedError("the other process is gone"))

    async def _read_loop(self) -> None:
        try:
            while True:
                header = await self._reader.readexactly(_HEADER.size)
                (length,) = _HEADER.unpack(header)
                if length > MAX_MESSAGE_BYTES:
                    logger.error("channel.oversized length=%d", length)
                    return
                message = orjson.loads(await self._reader.readexactly(length))
                self._dispatch(message)
        except (asyncio.IncompleteReadError, ConnectionError, orjson.JSONDecodeError):
            pass
        finally:
            self._shut()

    def _dispatch(self, message: Message) -> None:
        if "re" in message:
            answer = self._waiting.get(message["re"])
            if answer is not None and not answer.done():
                answer.set_result(message)
            return
        task = asyncio.create_task(self._handle(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, message: Message) -> None:
        try:
            answer = await self._handler(message)
        except Exception as error:
            logger.exception(
                "channel.handler_failed op=%s", message.get("op", message.get("event"))
            )
            answer = {"error": "RUNTIME_INTERNAL_ERROR", "detail": type(error).__name__}
        if "id" in message and not self.closed.is_set():
            self._writer.write(encode({**(answer or {}), "re": message["id"]}))
