"""The private control channel between the supervisor and one worker process.

A stream socket pair (the worker inherits one end), carrying length-prefixed orjson messages:
a 4-byte big-endian length, then one JSON object. Three kinds of message::

    {"id": 7, "op": "begin", ...}      a request; the other side answers it
    {"re": 7, ...}                     the answer to request 7
    {"event": "state", ...}            a one-way notice

Either side may send requests. A handler that raises is answered ``RUNTIME_INTERNAL_ERROR``
(the requester is never left waiting) and reported to ``on_failure`` when one was given (the
supervisor ends on it). End of file means the other process is gone; nothing else ends
the channel: the sender refuses a message over :data:`MAX_MESSAGE_BYTES`
(:class:`MessageTooLargeError`, nothing is sent), and a receiver skips a frame that is over the
limit or is not a JSON object (logged) and reads on. What the messages are is
:mod:`.messages`.
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

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Channel",
    "ChannelClosedError",
    "FailureHook",
    "Handler",
    "MessageTooLargeError",
    "read_frame_blocking",
]

logger = logging.getLogger("forgezero_lifecycle.serve.channel")

_HEADER: Final = struct.Struct("!I")
#: A state envelope is at most 1 MiB; its JSON escaping may grow it.
MAX_MESSAGE_BYTES: Final = 8 * 1024 * 1024

Message = dict[str, Any]
#: Answers a request (returns the answer's fields) or takes an event (returns None).
Handler = Callable[[Message], Awaitable[Message | None]]
#: Told when the handler raised: ``on_failure(message, error)``.
FailureHook = Callable[[Message, Exception], None]


class ChannelClosedError(ConnectionError):
    """The process on the other end is gone (end of file, or the channel was closed)."""


class MessageTooLargeError(ValueError):
    """A message over :data:`MAX_MESSAGE_BYTES` once encoded: it is not sent."""


#: Bytes read at a time while skipping an oversized frame.
_SKIP_CHUNK: Final = 64 * 1024


def encode(message: Message) -> bytes:
    body = orjson.dumps(message)
    if len(body) > MAX_MESSAGE_BYTES:
        raise MessageTooLargeError(
            f"a {len(body)}-byte message is over the channel's {MAX_MESSAGE_BYTES} bytes"
        )
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
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        handler: Handler,
        on_failure: FailureHook | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._handler = handler
        self._on_failure = on_failure
        self._next_id = 0
        self._waiting: dict[int, asyncio.Future[Message]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = asyncio.Event()
        self._reading: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, sock: socket.socket, handler: Handler, on_failure: FailureHook | None = None
    ) -> Channel:
        reader, writer = await asyncio.open_connection(sock=sock, limit=MAX_MESSAGE_BYTES)
        channel = cls(reader, writer, handler, on_failure)
        channel._reading = asyncio.create_task(channel._read_loop())
        return channel

    def notify(self, message: Message) -> None:
        """Send a one-way message (an event, or an initial configuration)."""
        if self.closed.is_set():
            return
        self._writer.write(encode(message))

    async def request(self, op: str, timeout: float = 10.0, **fields: Any) -> Message:
        """Send request ``op`` and wait (bounded) for its answer; raises
        :class:`MessageTooLargeError` (nothing sent) when it is over the limit."""
        if self.closed.is_set():
            raise ChannelClosedError("the channel is closed")
        self._next_id += 1
        number = self._next_id
        frame = encode({"id": number, "op": op, **fields})
        answer: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiting[number] = answer
        try:
            self._writer.write(frame)
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
                    logger.error("channel.oversized length=%d: skipped", length)
                    await self._skip(length)
                    continue
                try:
                    message = orjson.loads(await self._reader.readexactly(length))
                except orjson.JSONDecodeError:
                    logger.error("channel.not_json length=%d: skipped", length)
                    continue
                if not isinstance(message, dict):
                    logger.error("channel.not_an_object: skipped")
                    continue
                self._dispatch(message)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._shut()

    async def _skip(self, length: int) -> None:
        while length > 0:
            chunk = await self._reader.readexactly(min(length, _SKIP_CHUNK))
            length -= len(chunk)

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
        failure: Exception | None = None
        try:
            answer = await self._handler(message)
        except Exception as error:
            logger.exception(
                "channel.handler_failed op=%s", message.get("op", message.get("event"))
            )
            answer = {"error": "RUNTIME_INTERNAL_ERROR", "detail": type(error).__name__}
            failure = error
        self._answer(message, answer)
        if failure is not None and self._on_failure is not None:
            self._on_failure(message, failure)

    def _answer(self, message: Message, answer: Message | None) -> None:
        if "id" in message and not self.closed.is_set():
            try:
                frame = encode({**(answer or {}), "re": message["id"]})
            except MessageTooLargeError as error:
                logger.error("channel.answer_too_large: %s", error)
                frame = encode({"error": "RUNTIME_ANSWER_TOO_LARGE", "re": message["id"]})
            self._writer.write(frame)
