"""The in-flight middleware under hypercorn: nothing wrapped while serving an HTTP/1 request; a
drain acts on hypercorn's own ``HTTPStream`` instead.

While no drain has begun, an HTTP/1 request hypercorn's asyncio worker serves (its ``send`` is
the bound ``app_send`` of an ``HTTPStream``) reaches the app with the server's own ``receive``
(the stream's app queue) and ``send``; the middleware counts it and keeps the stream in its set
of running requests. Each drain moment then acts on the streams in that set, synchronously
(:meth:`~forgezero_lifecycle.core.gate.IntakeGate.watch`), through :class:`DrainSend`, which takes
the place of the stream's ``send`` (what ``app_send`` hands each response event to) until the app
returns:

* draining: a response not started yet gets ``connection: close`` (hypercorn's h11 then closes
  the connection after it), as a wrapped response would. One that started before keeps its
  connection, as under any server;
* notice: ``http.disconnect`` is put in the stream's app queue right after the last part of the
  request body (behind its last part in the queue, or as soon as that part arrives), so a
  ``receive()`` after the body, waiting at the notice or made later, returns it as if the client
  had left. When the app returns with its response unfinished, the connection is aborted, so
  the client sees the body incomplete (docs/long-lived-work.md, "A cut that can be seen");
* cutoff: a send blocked in flow control is given up: the connection is aborted (which lets the
  blocked send return), and from then on the app's next send, or a send that would block, raises
  :class:`~forgezero_lifecycle.ConnectionClosedByDrainError`.

HTTP/2 streams (``scope["http_version"]`` ``"2"``) share the class but not the connection, so
they are wrapped as under any other server. What this relies on of hypercorn, and of asyncio (a
queue's items, a writer's pause), is listed in :mod:`forgezero_lifecycle._internals.hypercorn`
and :mod:`forgezero_lifecycle._internals.asyncio`. A stream without it is served by the wrapped
path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, final

from .._internals import asyncio as _asyncio
from .._internals import hypercorn as _hypercorn
from .._internals import report
from .._internals.hypercorn import (
    H11_BODY_IN,
    STREAM_ATTRIBUTES,
    STREAM_MODULES,
    WS_STREAM_MODULE,
)
from .._race import first
from ..core.gate import DrainMoment
from ._drain_messages import CLOSE_HEADER, abandoned

__all__ = [
    "HTTP1",
    "KNOWN_STREAMS",
    "DrainSend",
    "act",
    "cut",
    "cut_response",
    "given_up",
    "learn",
    "release",
    "settle",
]

logger = logging.getLogger("forgezero_lifecycle.middleware")

#: RST_STREAM's error code for a stream the drain cut (RFC 9113, section 7: CANCEL).
_CANCEL: Final = 0x8
#: The HTTP versions served unwrapped (an HTTP/2 stream shares its connection with others).
HTTP1: Final = frozenset({"1.0", "1.1"})
#: Per class of ``send.__self__``: whether it is a hypercorn stream this path knows, filled by
#: :func:`learn` once per class (a middleware remembers the last class itself).
KNOWN_STREAMS: Final[dict[type, bool]] = {}


def learn(stream: object) -> bool:
    """Whether ``stream`` (a ``send.__self__``) is a hypercorn ``HTTPStream`` of the asyncio worker
    with all this path uses; remembered per class in KNOWN_STREAMS."""
    kind = type(stream)
    hypercorn_stream = kind.__name__ == "HTTPStream" and kind.__module__ in STREAM_MODULES
    known = (
        hypercorn_stream
        and all(hasattr(stream, name) for name in STREAM_ATTRIBUTES)
        and _has_what_a_drain_uses(stream)
    )
    if hypercorn_stream and not known:
        report(("hypercorn", "asyncio"))
    KNOWN_STREAMS[kind] = known
    return known


def _has_what_a_drain_uses(stream: Any) -> bool:
    queue = getattr(stream.app_put, "__self__", None)
    protocol = getattr(stream.send, "__self__", None)
    server = getattr(getattr(protocol, "send", None), "__self__", None)
    writer = getattr(server, "writer", None)
    return (
        isinstance(queue, asyncio.Queue)
        and not {"Queue._queue", "StreamWriter._protocol", "FlowControlMixin._paused"}
        & set(_asyncio.missing())
        and {"REQUEST", "RESPONSE"} <= set(getattr(type(stream.state), "__members__", ()))
        and hasattr(protocol, "connection")
        and isinstance(writer, asyncio.StreamWriter)
    )


def act(moment: DrainMoment, stream: Any) -> None:
    """Apply one drain moment to the stream of a request admitted before the drain."""
    if stream.closed or stream.state.name not in ("REQUEST", "RESPONSE"):
        return  # its response is complete
    drain = stream.send
    if type(drain) is not DrainSend:
        drain = stream.send = DrainSend(stream, drain)
    if moment == "notice" or moment == "cutoff":
        drain.tell_disconnect()
    if moment == "cutoff":
        drain.cut_off()


def cut(stream: Any) -> None:
    """A forced stop: abort the connection of a stream whose response is not complete (the
    next send of the app's raises, as after the cutoff gave the connection up)."""
    if stream.closed or stream.state.name not in ("REQUEST", "RESPONSE"):
        return
    drain = stream.send
    if type(drain) is not DrainSend:
        drain = stream.send = DrainSend(stream, drain)
    drain.abandon()


def given_up(stream: Any) -> bool:
    """Whether the cutoff gave up on this stream's connection (hypercorn then leaves it be)."""
    drain = stream.send
    if type(drain) is DrainSend and drain.abandoned:
        stream.closed = True
        return True
    return False


def release(stream: Any) -> None:
    """Once the app returned: hypercorn's own send again, for what hypercorn sends itself."""
    drain = stream.send
    if type(drain) is DrainSend:
        stream.send = drain.server_send
        drain.forget()


def settle(stream: Any) -> None:
    """After the app returned during a drain: a response the notice cut short has its
    connection aborted, so the client sees the body incomplete."""
    drain = stream.send
    if type(drain) is not DrainSend or given_up(stream) or not drain.told_consumed():
        return
    if stream.closed or stream.state.name != "RESPONSE":
        return
    logger.warning("drain.response_cut kind=http")
    stream.closed = True
    drain.abort()


def cut_response(stream: Any) -> bool:
    """A wrapped request's response the drain ended before its last part: its HTTP/1
    connection aborted, or its HTTP/2 stream reset (RST_STREAM, CANCEL). False when ``stream``
    is not a hypercorn stream this path knows."""
    known = KNOWN_STREAMS.get(type(stream))
    if known is None:
        known = learn(stream)
    if not known:
        return False
    logger.warning("drain.response_cut kind=http")
    protocol = stream.send.__self__
    writer: asyncio.StreamWriter = protocol.send.__self__.writer
    if stream.scope.get("http_version") == "2":
        # h2's RST_STREAM, and what else h2 has to send, written as the GOAWAY is (goaway).
        protocol.connection.reset_stream(stream.stream_id, error_code=_CANCEL)
        writer.write(protocol.connection.data_to_send())
        return True
    stream.closed = True
    writer.transport.abort()
    return True


@final
class DrainSend:
    """A running stream's ``send`` (hypercorn's protocol events) while a drain is on."""

    __slots__ = (
        "_cut",
        "_put_later",
        "_queue",
        "_stream",
        "_told",
        "abandoned",
        "close",
        "server_send",
    )

    def __init__(self, stream: Any, server_send: Callable[[Any], Awaitable[None]]) -> None:
        self._stream = stream
        self.server_send = server_send
        #: The stream's app queue, which the app's ``receive`` reads.
        self._queue: asyncio.Queue[Any] = stream.app_put.__self__
        #: Putting the disconnect behind a body part that waits for room in the queue.
        self._put_later: asyncio.Future[None] | None = None
        #: The response had not started when the drain began: it asks for the connection's close.
        self.close = stream.state.name == "REQUEST"
        #: The ``http.disconnect`` the notice put (or will put) in the app queue.
        self._told: dict[str, Any] | None = None
        #: Set at the cutoff: from then on a send that would block is given up.
        self._cut: asyncio.Event | None = None
        #: A send was blocked at the cutoff, or would have blocked after it.
        self.abandoned = False

    async def __call__(self, event: Any) -> None:
        if self.abandoned:
            raise abandoned()
        if self.close and type(event).__name__ == "Response" and event.status_code >= 200:
            self.close = False
            if not any(name.lower() == b"connection" for name, _ in event.headers):
                event = dataclasses.replace(event, headers=[*event.headers, CLOSE_HEADER])
        cut = self._cut
        if cut is None:
            await self.server_send(event)
            return
        sending = await first(self.server_send(event), cut.wait())
        if sending.cancelled():
            self.abandon()
            raise abandoned()
        sending.result()

    def tell_disconnect(self) -> None:
        """Have the app's next ``receive()`` after its body return ``http.disconnect``."""
        if self._told is not None:
            return
        told = self._told = {"type": "http.disconnect"}
        stream = self._stream
        protocol = self.server_send.__self__  # type: ignore[attr-defined]
        if protocol.connection.their_state.__name__ not in H11_BODY_IN:
            stream.app_put = _PutThenTell(stream.app_put, told)  # its last part is yet to come
        else:
            # The body is all in, but its last part may still be on its way into the queue: a
            # put waiting for room, or one a get() just woke and that has not run yet. A put of
            # our own, in a task scheduled after those, queues the disconnect behind it.
            self._put_later = asyncio.ensure_future(self._queue.put(told))

    def told_consumed(self) -> bool:
        """Whether the app's ``receive()`` returned the disconnect the notice put."""
        told = self._told
        if told is None:
            return False
        put = self._stream.app_put
        if type(put) is _PutThenTell and not put.put:
            return False
        if self._put_later is not None and not self._put_later.done():
            return False
        return not any(message is told for message in _asyncio.queued(self._queue))

    def forget(self) -> None:
        """The app returned: a disconnect still waiting for room in the queue is not needed."""
        if self._put_later is not None:
            self._put_later.cancel()

    def cut_off(self) -> None:
        if self._cut is None:
            self._cut = asyncio.Event()
            self._cut.set()
        # Writes paused: a send is blocked by a client that does not read.
        if _asyncio.write_paused(self._writer()):
            self.abandon()

    def abort(self) -> None:
        """Abort the connection at once (a response cut short: the client must see it)."""
        self._writer().transport.abort()

    def abandon(self) -> None:
        if self.abandoned:
            return
        self.abandoned = True
        logger.warning("drain.connection_abandoned kind=http")
        self._writer().transport.abort()  # the blocked send returns; the next one raises

    def _writer(self) -> asyncio.StreamWriter:
        server = self.server_send.__self__.send.__self__  # type: ignore[attr-defined]
        writer: asyncio.StreamWriter = server.writer
        return writer


@final
class _PutThenTell:
    """A stream's ``app_put`` after the notice, while the request body is still coming: the
    disconnect follows the body's last part into the app queue."""

    __slots__ = ("_put", "_told", "put")

    def __init__(self, put: Callable[[Any], Awaitable[None]], told: dict[str, Any]) -> None:
        self._put = put
        self._told = told
        #: The disconnect is in the queue.
        self.put = False

    async def __call__(self, message: dict[str, Any]) -> None:
        await self._put(message)
        if not self.put and message["type"] == "http.request" and not message.get("more_body"):
            self.put = True
            await self._put(self._told)


def websocket_transport(send: object) -> asyncio.Transport | None:
    """The connection of a hypercorn WebSocket session over HTTP/1 whose ``send`` this is (the
    bound ``app_send`` of a ``WSStream``, whose ``send`` is the H11Protocol's ``stream_send``,
    whose own ``send`` is the asyncio ``TCPServer``'s, with its ``writer``), or None: another
    server, a session over HTTP/2 (its connection is shared), or a hypercorn without these."""
    stream = getattr(send, "__self__", None)
    kind = type(stream)
    if kind.__name__ != "WSStream" or kind.__module__ != WS_STREAM_MODULE:
        return None
    protocol = getattr(getattr(stream, "send", None), "__self__", None)
    if type(protocol).__name__ != "H11Protocol":
        return None
    server = getattr(getattr(protocol, "send", None), "__self__", None)
    writer = getattr(server, "writer", None)
    if not isinstance(writer, asyncio.StreamWriter):
        return None
    transport: asyncio.Transport = writer.transport  # type: ignore[assignment]
    return transport


# HTTP/2: GOAWAY, twice (RFC 9113 6.8). hypercorn says nothing to an HTTP/2 client when a drain
# begins, and h2's own close_connection() would end the connection's state machine, so no
# response still running could be sent: the frames are written whole on the connection's
# writer, between h2's. What this relies on of hypercorn (the ``H2Protocol`` behind an HTTP/2
# stream's ``send``, and hyperframe) is listed in forgezero_lifecycle/_internals/hypercorn.py.

#: Per class of an HTTP/2 stream's ``send.__self__``: whether its protocol can be told GOAWAY.
KNOWN_H2: Final[dict[type, bool]] = {}


def h2_connection(send: object) -> Any | None:
    """The hypercorn ``H2Protocol`` of an HTTP/2 request whose ``send`` this is, or None (another
    server, or a hypercorn without what :func:`goaway` uses: logged once, naming its version)."""
    stream = getattr(send, "__self__", None)
    kind = type(stream)
    known = KNOWN_H2.get(kind)
    if known is None:
        known = KNOWN_H2[kind] = _learn_h2(stream)
    return stream.send.__self__ if known else None  # type: ignore[union-attr]


def _learn_h2(stream: object) -> bool:
    kind = type(stream)
    if kind.__name__ != "HTTPStream" or kind.__module__ not in STREAM_MODULES:
        return False
    protocol = getattr(getattr(stream, "send", None), "__self__", None)
    server = getattr(getattr(protocol, "send", None), "__self__", None)
    try:
        import hyperframe.frame  # noqa: F401  # hypercorn's HTTP/2 needs it: there with h2
    except ImportError:
        hyperframe_found = False
    else:
        hyperframe_found = True
    known = (
        type(protocol).__name__ == "H2Protocol"
        and hasattr(getattr(protocol, "connection", None), "highest_inbound_stream_id")
        and isinstance(getattr(protocol, "streams", None), dict)
        and isinstance(getattr(protocol, "stream_buffers", None), dict)
        and hasattr(protocol, "closed")
        and isinstance(getattr(server, "writer", None), asyncio.StreamWriter)
        and hyperframe_found
    )
    if not known:
        logger.warning(
            "drain.h2_goaway_unsupported hypercorn=%s: HTTP/2 clients are not sent GOAWAY by a "
            "drain; they learn of it from its 503s",
            _hypercorn.version(),
        )
    return known


def h2_idle(protocol: Any) -> bool:
    """Whether the connection has nothing left to send (or is closed): no stream running, and
    none whose last frames still wait in hypercorn's buffers. A stream leaves ``streams`` once
    its app is done, while its last DATA and END_STREAM may still wait for a client slow to
    read; a GOAWAY written before them would fail the stream at an h2 client (httpx's), and the
    final one's close would drop them."""
    return bool(protocol.closed) or not (protocol.streams or protocol.stream_buffers)


def stream_id(send: object) -> int:
    """The HTTP/2 stream id of a request whose ``send`` :func:`h2_connection` knows."""
    return send.__self__.stream_id  # type: ignore[attr-defined, no-any-return]


def goaway(protocol: Any, *, final: bool) -> int | None:
    """Write a GOAWAY (NO_ERROR) on ``protocol``'s connection naming the last stream hypercorn
    has taken in (the connection is idle: each is done); the final one also closes the
    connection once it is written. The last stream id, or None when the connection is closed."""
    from hyperframe.frame import GoAwayFrame

    if protocol.closed:
        return None
    writer: asyncio.StreamWriter = protocol.send.__self__.writer
    if writer.is_closing():
        return None
    last: int = protocol.connection.highest_inbound_stream_id
    writer.write(GoAwayFrame(stream_id=0, last_stream_id=last, error_code=0).serialize())
    if final:
        writer.close()  # after what is written is flushed
    return last
