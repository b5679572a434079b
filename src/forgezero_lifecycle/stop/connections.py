"""uvicorn's HTTP connections with a stop that answers what arrives and closes without resets.

uvicorn's own shutdown closes every connection that has no request in progress at once: a
connection it accepted but has not read yet, and an idle keep-alive connection whose client is
sending its next request at that moment, are closed under a client that could have sent its
request, and a ``close()`` with unread bytes in the kernel's receive buffer sends a reset that can
destroy a response already written. :class:`ConnectionStop` replaces that with:

* a first-byte grace: once the stop begins, a connection with no request in progress stays open
  for ``first_byte_grace`` seconds (counted from the stop, or from its accept if later); a request
  that arrives in it is parsed and answered (a draining runtime refuses it with 503 and
  ``Connection: close``), then the connection is closed; one that stays silent is closed at the
  end of the grace, unless bytes wait unread in its receive buffer then (a request the loop has
  not read yet: it is answered first);
* a refusal before every close of a silent connection, and after a response that had started
  when the stop began (it went out without ``Connection: close``, so its client keeps the
  connection) once it is complete: a client may send its request at the instant the server
  closes (the race of every keep-alive close: a pooled connection taken just before the FIN
  arrives), and such a request would be lost, as a bare disconnect; so the server writes a
  ``503 RUNTIME_DRAINING`` with ``Connection: close`` (and ``x-forgezero-refusal:
  connection-closed``) before its FIN, which a client that sent reads as its answer (safe to
  retry: the request was never read) and a client that did not send takes as the end of the
  connection (readable before reuse, as a FIN is); a response cut short is closed without it;
* a lingering close for every connection the server closes, stop or not: the transport sends
  its FIN after flushing what was written (``shutdown(SHUT_WR)``), then reads and discards until
  the client's FIN or ``LINGER_TIMEOUT``, and only then closes, so the client reads the whole
  answer and never meets a reset caused by bytes the server did not read.

* a bound: a WebSocket session still open at the first-byte grace plus the lingering close
  plus a second after the stop told it to close is aborted and named in the log
  (:meth:`ConnectionStop.abort_overdue`), so a close that never completes does not hold the exit
  until the server's graceful timeout;

* once the stop has begun, a request that arrives on an open connection is answered with
  ``Connection: close`` (its cycle's ``keep_alive`` is cleared as it is parsed), so a keep-alive
  client learns from the answer itself that it must reconnect.

A stop may begin as a handover (:meth:`ConnectionStop.begin` with ``websockets=False``): the
server has stopped accepting while sibling processes still accept on the same listener, so every
HTTP connection moves over to them this way; WebSocket sessions are left to the drain's notice.
:meth:`ConnectionStop.wait_moved` tells when every connection that was idle has moved: closed, or
carrying a request that the app now runs. Only then may the drain close intake: a request that
reached the process before that, even one the loop of a loaded machine reads late, is answered,
never refused.

The protocol classes are uvicorn's own (``H11Protocol``, ``HttpToolsProtocol``) with
``connection_made`` extended (the lingering transport); ``data_received`` and
``on_response_complete`` (and ``connection_lost``) are extended on each connection only once the
stop begins, so a request
served before costs what it costs under uvicorn alone. What they rely on of uvicorn is listed in
:mod:`forgezero_lifecycle._internals.uvicorn`.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import logging
import sys
import termios
from collections.abc import Iterable
from typing import Any, Final, final

from ..wire._protocol import REFUSAL_BODY

__all__ = [
    "CLOSE_REFUSAL_HEADER",
    "LINGER_TIMEOUT",
    "ConnectionStop",
    "close_after_response",
    "zero_loss_protocol",
]

logger = logging.getLogger("forgezero_lifecycle.serve")

#: How long a closed connection waits for the client's FIN before it is aborted.
LINGER_TIMEOUT: Final = 2.0
#: The header that tells the refusal written at a connection's close from the drain's refusal of
#: a request it read (both are 503 RUNTIME_DRAINING, both never ran).
CLOSE_REFUSAL_HEADER: Final = (b"x-forgezero-refusal", b"connection-closed")
#: Written before the server closes a silent connection, for a request crossing the close.
CROSSING_REFUSAL: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"content-type: application/json\r\n"
    b"content-length: %d\r\n"
    b"retry-after: 1\r\n"
    b"%s: %s\r\n"
    b"connection: close\r\n\r\n%s" % (len(REFUSAL_BODY), *CLOSE_REFUSAL_HEADER, REFUSAL_BODY)
)
#: Added to the first-byte grace and the lingering close for the stop's bound on a connection
#: with no response under way (:attr:`ConnectionStop.bound`): the answer to a last request.
OVERDUE_MARGIN: Final = 1.0


@final
class ConnectionStop:
    """The stop's state shared by every connection of one server."""

    def __init__(self, first_byte_grace: float) -> None:
        self.first_byte_grace = first_byte_grace
        self.stopping = False
        self._lingering: set[asyncio.Future[None]] = set()
        #: Idle HTTP connections still open since the stop began: each may yet carry a request.
        self._unmoved: set[Any] = set()
        self._moved: asyncio.Event | None = None

    def begin(self, connections: set[Any], *, websockets: bool = True) -> None:
        """From now on, idle connections close after the first-byte grace, busy ones after
        their response; ``websockets=False`` (a handover) leaves WebSocket sessions open."""
        self.stopping = True
        for connection in list(connections):
            if hasattr(connection, "cycle"):
                self.arm(connection)
            elif websockets:  # a WebSocket session: uvicorn's own shutdown sends close 1012
                connection.shutdown()

    def arm(self, protocol: Any) -> None:
        _extend_for_stop(protocol, self)
        cycle = protocol.cycle
        if cycle is not None and not cycle.response_complete:
            close_after_response(protocol, cycle)
        else:
            self._unmoved.add(protocol)
            loop = asyncio.get_running_loop()
            loop.call_later(self.first_byte_grace, self.close_if_idle, protocol)

    def moved(self, protocol: Any) -> None:
        """``protocol``'s connection holds no request the stop must still wait for: it closed,
        or the request it carried is the app's now."""
        unmoved = self._unmoved
        if protocol in unmoved:
            unmoved.discard(protocol)
            if not unmoved and self._moved is not None:
                self._moved.set()

    async def wait_moved(self) -> None:
        """Wait until every connection that was idle when the stop began (or that was accepted
        since) has closed or carries a request the app runs: the first-byte grace, or longer
        where the loop lags behind requests that have arrived."""
        if self._unmoved:
            self._moved = asyncio.Event()
            await self._moved.wait()

    @property
    def bound(self) -> float:
        """Seconds after :meth:`begin` by which every connection with no response under way has
        closed: the first-byte grace, a quick answer, and a lingering close (a WebSocket
        session's close handshake takes less)."""
        return self.first_byte_grace + LINGER_TIMEOUT + OVERDUE_MARGIN

    def abort_overdue(self, connections: set[Any]) -> list[str]:
        """Abort every connection still open at :attr:`bound` that the stop does not drive
        itself; returns their protocols' names.

        An HTTP connection is the stop's own (its first-byte grace and lingering close are
        bounded, a response under way has the server's graceful timeout), and one that looks
        idle may hold a request the loop has not read yet: it is left alone. Anything else is a
        WebSocket session told to close when the stop began (1012): one still open now is held
        by a close that never completes, and would hold the server's exit until its graceful
        timeout (the drain deadline and more) for nothing.
        """
        aborted: list[str] = []
        for connection in list(connections):
            if hasattr(connection, "cycle"):
                continue
            aborted.append(type(connection).__name__)
            connection.transport.abort()
        return aborted

    def close_if_idle(self, protocol: Any) -> None:
        transport = protocol.transport
        if transport.get_protocol() is not protocol:
            # Upgraded: the connection is a WebSocket session's now (uvicorn handed it over
            # with set_protocol), left to the drain's notice; closing it would cut the session.
            self.moved(protocol)
            return
        cycle = protocol.cycle
        if cycle is None or cycle.response_complete:
            if _bytes_waiting(transport):
                # A request arrived that the loop has not read yet (it lags behind, as on a
                # loaded machine): it is answered, with Connection: close, and the connection
                # closes after that answer; looked at again after the grace in case it was
                # only part of a request.
                asyncio.get_running_loop().call_later(
                    self.first_byte_grace, self.close_if_idle, protocol
                )
                return
            if not transport.is_closing() and _may_answer(protocol, transport):
                transport.write(CROSSING_REFUSAL)
            transport.close()
        self.moved(protocol)

    def linger(self, transport: asyncio.Transport, owner: asyncio.BaseProtocol) -> None:
        """Close ``transport`` the lingering way; ``owner`` is told the connection is lost."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._lingering.add(done)
        done.add_done_callback(self._lingering.discard)
        transport.set_protocol(_Lingering(transport, done))
        if not transport.can_write_eof():
            transport.close()
        else:
            try:
                transport.write_eof()  # after the write buffer is flushed
            except OSError:
                # The client is gone already (its reset not read yet: ENOTCONN): nothing is
                # left to deliver, and the error must not reach the app that closed.
                transport.abort()
        loop.call_soon(owner.connection_lost, None)

    async def wait_lingering(self) -> None:
        """Wait until every lingering close has finished (each is bounded by its timeout)."""
        if self._lingering:
            await asyncio.wait(set(self._lingering))


def close_after_response(protocol: Any, cycle: Any) -> None:
    """``protocol``'s connection closes once ``cycle``'s response (under way) is complete; if its
    head went out without ``Connection: close``, its client keeps the connection and may send the
    next request at once, crossing that close: the refusal is written before it."""
    cycle.keep_alive = False
    transport = protocol.transport
    if cycle.response_started and isinstance(transport, _LingeringTransport):
        transport.refuse_after = cycle


def _may_answer(protocol: Any, transport: asyncio.BaseTransport) -> bool:
    """Whether an answer may be written on ``protocol``'s silent connection: not over TLS before
    its first request (its handshake may not be done)."""
    return protocol.cycle is not None or transport.get_extra_info("sslcontext") is None


def _bytes_waiting(transport: asyncio.BaseTransport) -> bool:
    """Whether bytes wait unread in the kernel's receive buffer of ``transport``'s socket
    (``FIONREAD``); False where that cannot be read."""
    sock = transport.get_extra_info("socket")
    if sock is None or sys.platform == "win32":
        return False
    waiting = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, waiting)
    except (OSError, ValueError):
        return False
    return waiting[0] > 0


@final
class _Lingering(asyncio.Protocol):
    """What is left of a closed connection: discard the client's bytes until its FIN."""

    def __init__(self, transport: asyncio.Transport, done: asyncio.Future[None]) -> None:
        self._transport = transport
        self._done = done
        self._timer = asyncio.get_running_loop().call_later(LINGER_TIMEOUT, self._give_up)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # the transport closes itself: both FINs have been sent

    def connection_lost(self, exc: Exception | None) -> None:
        self._timer.cancel()
        if not self._done.done():
            self._done.set_result(None)

    def _give_up(self) -> None:
        # The client neither closed nor read: its write buffer may never flush, so abort.
        self._transport.abort()


@final
class _LingeringTransport(asyncio.Transport):
    """The transport uvicorn's protocol sees: the real one, except that ``close()`` lingers."""

    def __init__(self, transport: asyncio.Transport, stop: ConnectionStop) -> None:
        super().__init__()
        self._transport = transport
        self._stop = stop
        self._closed = False
        #: The cycle of a response the stop could not mark ``Connection: close``
        #: (:func:`close_after_response`): once it is complete, the close writes the crossing
        #: refusal first (never after a response cut short: its client must see the cut).
        self.refuse_after: Any = None
        # The calls made per request, bound once so they cost what the real ones cost;
        # is_closing is the real one's until this transport is closed (then always True).
        self.write = transport.write  # type: ignore[method-assign]
        self.get_extra_info = transport.get_extra_info  # type: ignore[method-assign]
        self.pause_reading = transport.pause_reading  # type: ignore[method-assign]
        self.resume_reading = transport.resume_reading  # type: ignore[method-assign]
        self.is_closing = transport.is_closing  # type: ignore[method-assign]

    def close(self) -> None:
        if self._closed:
            return
        self._mark_closed()
        transport = self._transport
        if transport.is_closing():
            transport.close()
            return
        refused = self.refuse_after
        if refused is not None and refused.response_complete:
            transport.write(CROSSING_REFUSAL)
        self._stop.linger(transport, transport.get_protocol())

    def abort(self) -> None:
        self._mark_closed()
        self._transport.abort()

    def _mark_closed(self) -> None:
        self._closed = True
        self.is_closing = _always_closing  # type: ignore[method-assign]

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self._transport.writelines(list_of_data)

    def write_eof(self) -> None:
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()


def _always_closing() -> bool:
    return True


def _extend_for_stop(protocol: Any, stop: ConnectionStop) -> None:
    """From the stop on, ``protocol``'s two calls made per request do the stop's part too: a
    request parsed from now on is answered with Connection: close (and its connection has
    moved: :meth:`ConnectionStop.wait_moved`), and a connection whose response is complete
    closes if idle; its loss is told to the stop too. Bound on the instance once the stop begins, so a
    request served before any stop runs uvicorn's own methods and nothing else."""
    if "on_response_complete" in vars(protocol):
        return  # extended already
    received = protocol.data_received
    completed = protocol.on_response_complete
    lost = protocol.connection_lost

    def data_received(data: bytes) -> None:
        received(data)
        cycle = protocol.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False
            stop.moved(protocol)  # its task runs the app before the drain can close intake

    def connection_lost(exc: Exception | None) -> None:
        lost(exc)
        stop.moved(protocol)

    def on_response_complete() -> None:
        completed()  # a cycle made from now on is given this one (uvicorn's ``on_response``)
        stop.close_if_idle(protocol)

    protocol.data_received = data_received
    protocol.on_response_complete = on_response_complete
    protocol.connection_lost = connection_lost
    transport = protocol.transport
    if transport is not None and transport.get_protocol() is protocol:
        # uvloop keeps the protocol's bound data_received from set_protocol on: renew it.
        transport.set_protocol(protocol)


def zero_loss_protocol(
    base: type[asyncio.Protocol], stop: ConnectionStop
) -> type[asyncio.Protocol]:
    """``base`` (uvicorn's ``H11Protocol`` or ``HttpToolsProtocol``) with the stop's behaviour:
    its connections close the lingering way; the stop's part of each request is added to a
    connection only once the stop begins (:meth:`ConnectionStop.arm`)."""
    existing = getattr(base, "zero_loss_stop", None)
    if existing is not None:
        raise TypeError(f"{base.__qualname__} already has a zero-loss stop")
    base_connection_made: Any = base.connection_made
    if getattr(base, "on_response_complete", None) is None:
        raise TypeError(f"{base.__qualname__} has no on_response_complete: not a uvicorn protocol")

    def connection_made(self: Any, transport: asyncio.Transport) -> None:
        base_connection_made(self, _LingeringTransport(transport, stop))
        if stop.stopping:  # accepted while the stop takes what was queued
            stop.arm(self)

    namespace = {"connection_made": connection_made, "zero_loss_stop": stop}
    cls: type[asyncio.Protocol] = type(f"ZeroLoss{base.__name__}", (base,), namespace)
    return cls
