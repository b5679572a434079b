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
limit or is not a JSON object (logged) and reads on.

The messages, as types both ends import (at the end of this module).

Worker → supervisor::

    {"event": "state", "state": ..., ...}              StateReport (a one-way notice)
    {"event": "limit", "why": str}                     LimitReport: past a recycling limit
    {"id": 7, "op": "control", "call": str, "args": {}}  ControlCall, answered with
                                                        {"status": int, "headers": [[n, v]], "body": ...}

Supervisor → worker: one request per entry of :data:`COMMANDS` (``{"id": 7, "op": <name>,
...fields}``), each answered by the worker's handler of that name (a dispatch table in
:mod:`.worker`). A message that does not decode is answered ``RUNTIME_BAD_MESSAGE`` and changes
nothing; it never ends the channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, final

import orjson

__all__ = [
    "COMMANDS",
    "COUNTER_KINDS",
    "MAX_MESSAGE_BYTES",
    "Channel",
    "ChannelClosedError",
    "ControlCall",
    "FailureHook",
    "Handler",
    "LimitReport",
    "MessageTooLargeError",
    "StateReport",
    "WorkerReport",
    "decode_worker_message",
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


# The messages.


COUNTER_KINDS: Final = ("http", "websocket", "jobs", "schedules")

#: The supervisor's commands to a worker: name → the fields it carries.
COMMANDS: Final = {
    "begin": ("request",),
    "rollback": ("nonce",),
    "status": (),
    "schedules": (),
    "metrics": (),
    "import": ("request", "timeoutMs"),
    "accept": (),
    "stop_accepting": (),
    "stop": ("force",),
    # Leave a generation that serves on (recycled, scaled down): stop accepting, let the
    # keep-alive clients move to the siblings for ``grace`` seconds, then drain and stop.
    "retire": ("grace",),
    # The heartbeat (``--worker-timeout``): answered by the worker's event loop.
    "ping": (),
}


@final
@dataclass(frozen=True, slots=True)
class StateReport:
    """What a worker reports of itself: booting, ready, failed to start, and its drain."""

    state: str
    pid: int | None = None
    nonce: str | None = None
    in_flight: dict[str, int] | None = None
    failure: str | None = None
    detail: str | None = None
    private_port: int = 0
    state_kind: dict[str, Any] | None = None
    revision: str | None = None

    def wire(self) -> dict[str, Any]:
        fields = {
            "pid": self.pid,
            "nonce": self.nonce,
            "inFlight": self.in_flight,
            "failure": self.failure,
            "detail": self.detail,
            "privatePort": self.private_port or None,
            "stateKind": self.state_kind,
            "revision": self.revision,
        }
        present = {key: value for key, value in fields.items() if value is not None}
        return {"event": "state", "state": self.state, **present}


@final
@dataclass(frozen=True, slots=True)
class ControlCall:
    """A control request the worker forwards, for the whole generation."""

    call: str
    args: dict[str, Any]

    def wire(self) -> dict[str, Any]:
        return {"op": "control", "call": self.call, "args": self.args}


@final
@dataclass(frozen=True, slots=True)
class LimitReport:
    """The worker passed one of its recycling limits (sent again while it still accepts)."""

    why: str

    def wire(self) -> dict[str, Any]:
        return {"event": "limit", "why": self.why}


WorkerReport = StateReport | ControlCall | LimitReport


def _optional(message: dict[str, Any], key: str, kind: type) -> Any:
    value = message.get(key)
    if value is not None and not isinstance(value, kind):
        raise ValueError(f"{key} must be {kind.__name__}")
    return value


def decode_worker_message(message: dict[str, Any]) -> WorkerReport | str:
    """The typed message, or why it is not one (a string)."""
    try:
        if message.get("event") == "state":
            state = message.get("state")
            if not isinstance(state, str):
                return "a state report without a state"
            in_flight = _optional(message, "inFlight", dict)
            port = _optional(message, "privatePort", int)
            return StateReport(
                state=state,
                pid=_optional(message, "pid", int),
                nonce=_optional(message, "nonce", str),
                in_flight=None if in_flight is None else {k: int(v) for k, v in in_flight.items()},
                failure=_optional(message, "failure", str),
                detail=_optional(message, "detail", str),
                private_port=port or 0,
                state_kind=_optional(message, "stateKind", dict),
                revision=_optional(message, "revision", str),
            )
        if message.get("event") == "limit":
            why = message.get("why")
            if not isinstance(why, str):
                return "a limit report without why (a string)"
            return LimitReport(why)
        if message.get("op") == "control":
            call, args = message.get("call"), message.get("args")
            if not isinstance(call, str) or not isinstance(args, dict):
                return "a control call needs call (a string) and args (an object)"
            return ControlCall(call, args)
    except (ValueError, TypeError, AttributeError) as error:
        return str(error)
    return f"unknown message {sorted(message)}"
