"""The zero-loss stop of a uvicorn server: ``serve``'s, the gunicorn worker class's, and the one
the runtime's signal hook gives a uvicorn the user runs.

Once the drain has settled (:func:`zero_loss_shutdown`):

1. an own listener refuses new handshakes (:func:`.sockets.refuse_new_connections`) and is
   accepted from until its accept queue is empty, then closed; a shared listener (other
   processes accept on it: ``uvicorn --workers``, gunicorn, ``serve --workers``) is only no
   longer accepted from, and keeps its queue for them;
2. every connection gets the first-byte grace or closes after its response
   (:class:`ConnectionStop`), each closed the lingering way;
3. then uvicorn's own wait for connections and tasks, and the lifespan shutdown; a WebSocket
   session still open at the stop's bound (:attr:`ConnectionStop.bound`) is aborted
   and named, so the exit never waits for its close until the graceful timeout.

A stop on a shared listener can begin as a handover (:meth:`ServerStop.hand_over`): this
process stops accepting at once and every HTTP connection is armed, so keep-alive clients are
answered with ``Connection: close`` and reconnect to a sibling while the drain has not closed
intake yet; nothing is refused.

A handover is right at a reload, where a sibling goes on accepting (uvicorn ``--workers``
replaces a worker only once its replacement is ready; gunicorn's HUP starts the new workers
before it stops the old ones). At the final stop every worker is told to stop at once, and the
clients would reconnect into an accept queue nobody takes from any more, which is reset when the
last process holding the listener exits. So the handing-over worker keeps a descriptor of the
listener and watches (:meth:`ServerStop.watch_for_final_stop`) whether a sibling still accepts
(:func:`.sockets.accepting_elsewhere`: its event loop watches the listener). Once none does, and no sibling can start accepting again (gunicorn's arbiter has
closed its listener, which it does only at its final stop; uvicorn's parent starts no worker at
its final stop), the stop is the final one: the worker accepts again, answers every request with
``Connection: close`` (the drain refuses them with 503 once intake is closed), and its shutdown
treats the listener as its own (step 1 above: new handshakes refused, the queue emptied).
Several workers may all conclude so at once: each keeps accepting until the queue is empty after
the filter is attached, so the last one to close leaves nothing queued.

**Each connection's stop.** uvicorn's HTTP connections with a stop that answers what arrives
and closes without resets.

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

**Accepting on a listener siblings share.** Accepting on a listening socket that sibling
processes accept on too: one connection a wake-up.

asyncio's server accepts up to ``backlog`` queued connections each time the loop reports the
listening socket readable (``BaseSelectorEventLoop._accept_connection`` in
``asyncio/selector_events.py``; libuv's ``uv__server_io`` under uvloop accepts until the queue
is empty), and uvicorn passes its ``backlog`` (2048). Every process waiting on a shared socket
is woken by the same new connection, and the first to run takes everything queued: a burst of
keep-alive clients lands on one worker, which then serves them alone for as long as they stay.

:class:`SharedListener` accepts one connection each time the loop reports the socket readable,
then returns to the loop: the siblings woken by the same readiness take theirs, and a busy
worker (which is slow to return to its loop) leaves the queue to the idle ones. It never calls
``listen()`` on the socket (``create_server(sock=...)`` does, which resizes the one queue every
process shares).

One connection a wake-up is not enough where the siblings compete for the CPU (a busy machine,
or a load generator on the same cores): the worker that runs first keeps taking one connection
per loop turn while a sibling woken by the same readiness waits for a core. Workers that share a
:class:`Tally` (the open connections of each, in memory they share: ``serve --workers`` gives one
to each generation) therefore leave a queued connection to a sibling that holds fewer
(:func:`may_accept`): a worker ahead by more than ``SLACK`` stops watching the socket for
``DEFER_POLL`` and looks again, for at most ``DEFER_LIMIT`` (so a sibling that is stuck, or busy
for long, delays a connection by that much at most, and only while it holds fewer).

To a uvicorn server it is one of ``Server.servers`` like asyncio's (``sockets``, ``close``,
``wait_closed``), so uvicorn's own shutdown and :func:`zero_loss_shutdown` stop it the
same way: ``close`` stops this process accepting and closes its descriptor only; the kernel
socket and its queue stay with the processes that hold it. A connection accepted just before
``close`` is still made (its protocol sees the stop already begun, as with asyncio's server).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import fcntl
import logging
import mmap
import os
import socket
import ssl
import struct
import sys
import tempfile
import termios
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import IO, Any, Final, final

import uvicorn

from .._internals import uvicorn as _uvicorn
from ..wire._protocol import REFUSAL_BODY
from .sockets import (
    ListeningSocket,
    accept_queue_length,
    accepting_elsewhere,
    parent_holds,
    refuse_new_connections,
)

__all__ = [
    "ACCEPT_RETRY_DELAY",
    "CLOSE_REFUSAL_HEADER",
    "DEFER_LIMIT",
    "DEFER_POLL",
    "FIRST_BYTE_GRACE",
    "HANDOVER_GRACE",
    "LINGER_TIMEOUT",
    "SLACK",
    "ConnectionStop",
    "ServerStop",
    "SharedListener",
    "Tally",
    "ZeroLossServer",
    "accept_one_at_a_time",
    "close_after_response",
    "cut_connections",
    "may_accept",
    "zero_loss_protocol",
    "zero_loss_shutdown",
]


logger = logging.getLogger("forgezero_lifecycle.stop")
_UVICORN_LOG: Final = logging.getLogger("uvicorn.error")


# Each connection's stop.

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


# Accepting on a listener that sibling processes share.


#: How long accepting pauses when the process is out of descriptors or memory (asyncio's own).
ACCEPT_RETRY_DELAY: Final = 1.0
_OUT_OF_RESOURCES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

#: How many more open connections than its least-loaded sibling a worker may hold and still
#: take the next queued connection at once.
SLACK: Final = 1
#: How long a worker that is ahead stops watching the socket before it looks again.
DEFER_POLL: Final = 0.002
#: The longest a worker that is ahead leaves queued connections to its siblings; then it takes one.
DEFER_LIMIT: Final = 0.025
_SLOT: Final = struct.Struct("q")
#: A slot of a worker that does not accept (not yet, no more, or exited).
_ABSENT: Final = -1

ProtocolFactory = Callable[[], asyncio.Protocol]


def may_accept(mine: int, siblings: Sequence[int], deferred: float) -> bool:
    """Whether a worker holding ``mine`` open connections takes the next queued one now, when
    its accepting siblings hold ``siblings`` and it has left the queue to them for ``deferred``
    seconds."""
    return not siblings or mine <= min(siblings) + SLACK or deferred >= DEFER_LIMIT


@final
class Tally:
    """The open connections of each worker of one generation, in a file the processes map
    (one signed 8-byte slot per worker; ``-1``: the worker does not accept). A worker of
    ``serve --workers`` publishes 0 once it is ready, before it is told to accept: the sibling
    that acts on the supervisor's ``accept`` first then leaves it its share of a burst instead
    of taking the whole queue while it is still on its way (each connection deferred at most
    ``DEFER_LIMIT``, as for any sibling).

    The supervisor :meth:`create` s it with the generation and passes its descriptor to every
    worker, which :meth:`attach` es to its slot. A count is written by its worker when it looks
    at the queue, so a sibling's may be too high (connections closed since), never too low while
    it accepts: a stale count only makes the others take connections sooner.
    """

    def __init__(self, view: mmap.mmap, workers: int, index: int | None) -> None:
        self._view = view
        self._workers = workers
        self._index = index

    @classmethod
    def create(cls, workers: int) -> tuple[Tally, IO[bytes]]:
        """A tally for ``workers`` workers, every slot absent, and the file to pass on."""
        file = tempfile.TemporaryFile()  # noqa: SIM115 - the generation closes it
        file.write(_SLOT.pack(_ABSENT) * workers)
        file.flush()
        return cls(mmap.mmap(file.fileno(), _SLOT.size * workers), workers, None), file

    @classmethod
    def attach(cls, fd: int, workers: int, index: int | None) -> Tally:
        """Worker ``index``'s view of the tally passed as ``fd`` (closed here: the map stays);
        ``index`` None: a worker without a slot of its own (it reads its siblings' counts)."""
        try:
            view = mmap.mmap(fd, _SLOT.size * workers)
        finally:
            os.close(fd)
        return cls(view, workers, index)

    def publish(self, count: int) -> None:
        """This worker holds ``count`` open connections (``-1``: it no longer accepts)."""
        if self._index is not None and not self._view.closed:
            _SLOT.pack_into(self._view, _SLOT.size * self._index, count)

    def clear(self, index: int) -> None:
        """Worker ``index`` no longer accepts (the supervisor saw it exit)."""
        if not self._view.closed and index < self._workers:
            _SLOT.pack_into(self._view, _SLOT.size * index, _ABSENT)

    def siblings(self) -> list[int]:
        """The counts of the other workers that accept."""
        counts = (_SLOT.unpack_from(self._view, _SLOT.size * i)[0] for i in self._others())
        return [count for count in counts if count != _ABSENT]

    def _others(self) -> list[int]:
        return [i for i in range(self._workers) if i != self._index]

    def close(self) -> None:
        self._view.close()


@final
class SharedListener(asyncio.AbstractServer):
    """Serve ``protocol_factory`` on ``sock``, accepting one connection per readiness report."""

    def __init__(
        self,
        sock: socket.socket,
        protocol_factory: ProtocolFactory,
        *,
        ssl_context: ssl.SSLContext | None,
        tally: Tally | None = None,
        held: Callable[[], int] = lambda: 0,
    ) -> None:
        """``tally``: the generation's, to leave queued connections to siblings that hold fewer
        (``held``: how many connections this process holds open)."""
        self._loop = asyncio.get_running_loop()
        self._tally = tally
        self._held = held
        self._deferred_since: float | None = None
        self._sock: socket.socket | None = sock
        self._fd = sock.fileno()
        self._factory = protocol_factory
        self._ssl = ssl_context
        self._making: set[asyncio.Task[None]] = set()
        sock.setblocking(False)
        self._loop.add_reader(self._fd, self._accept_one)

    @property
    def sockets(self) -> list[socket.socket]:
        """The listening socket while serving (asyncio's server: empty once closed)."""
        return [] if self._sock is None else [self._sock]

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._sock is not None

    async def start_serving(self) -> None:
        """It serves from the start."""

    async def serve_forever(self) -> None:
        raise NotImplementedError("a SharedListener serves from the start; close() stops it")

    def close(self) -> None:
        """Stop accepting; close this process's descriptor (never ``shutdown()``: the socket is
        shared, and its queue belongs to the siblings)."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        self._loop.remove_reader(self._fd)
        sock.close()
        if self._tally is not None:
            self._tally.publish(_ABSENT)

    async def wait_closed(self) -> None:
        """Wait until the connections accepted before ``close`` are made."""
        if self._making:
            await asyncio.wait(set(self._making))

    def _accept_one(self) -> None:
        sock = self._sock
        if sock is None or self._leave_to_siblings():
            return
        try:
            conn, _ = sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return  # a sibling took it
        except OSError as error:
            if error.errno not in _OUT_OF_RESOURCES:
                raise  # the loop logs it and keeps the reader
            logger.error("stop.accept_paused seconds=%.1f: %r", ACCEPT_RETRY_DELAY, error)
            self._loop.remove_reader(self._fd)
            self._loop.call_later(ACCEPT_RETRY_DELAY, self._resume)
            return
        conn.setblocking(False)
        task = self._loop.create_task(self._make(conn))
        self._making.add(task)
        task.add_done_callback(self._making.discard)

    def _leave_to_siblings(self) -> bool:
        """Publish this worker's count; True (and look again after ``DEFER_POLL``) while a
        sibling holds fewer connections and should take the queued one."""
        tally = self._tally
        if tally is None:
            return False
        mine = self._held() + len(self._making)
        tally.publish(mine)
        now = self._loop.time()
        deferred = 0.0 if self._deferred_since is None else now - self._deferred_since
        if may_accept(mine, tally.siblings(), deferred):
            self._deferred_since = None
            return False
        if self._deferred_since is None:
            self._deferred_since = now
        self._loop.remove_reader(self._fd)
        self._loop.call_later(DEFER_POLL, self._resume)
        return True

    def _resume(self) -> None:
        if self._sock is None:
            return
        if accept_queue_length(self._sock) == 0:
            self._deferred_since = None  # a sibling took what was queued
        self._loop.add_reader(self._fd, self._accept_one)

    async def _make(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn, ssl=self._ssl)
        except (OSError, TimeoutError) as error:  # ssl.SSLError is an OSError
            logger.info("stop.connection_not_made: %r", error)
            conn.close()


def accept_one_at_a_time(
    server: uvicorn.Server, sockets: Sequence[socket.socket], tally: Tally | None = None
) -> None:
    """Serve a started uvicorn ``server`` on shared ``sockets`` with :class:`SharedListener`
    (added to ``server.servers``, where its stop finds them), balanced over ``tally``."""
    config = server.config
    state = server.server_state
    protocol = _uvicorn.protocol_factory(server)
    for sock in sockets:
        listener = SharedListener(
            sock,
            protocol,
            ssl_context=config.ssl,
            tally=tally,
            held=lambda: len(state.connections),
        )
        # uvicorn types the list as asyncio servers; it uses close() and wait_closed() of them.
        server.servers.append(listener)  # type: ignore[arg-type]


# The server's stop: the listeners and the connections put together.


#: Pause between readings of a closing listener's accept queue.
HANDSHAKE_SETTLE: Final = 0.1
#: The longest the stop keeps accepting what is queued before it closes the listener anyway.
ACCEPT_QUEUE_TIMEOUT: Final = 2.0
#: How long an idle connection stays open for a request once the stop began (``serve``'s
#: ``--first-byte-grace`` default).
FIRST_BYTE_GRACE: Final = 1.0
#: How long a handing-over worker answers on its open connections before its drain closes
#: intake, on an unloaded machine: the first-byte grace and a margin (the wait itself ends on an
#: event: :meth:`ServerStop.wait_moved`). gunicorn's ``--graceful-timeout`` counts it.
HANDOVER_GRACE: Final = FIRST_BYTE_GRACE + 0.5
#: Pause between two looks of a handing-over worker at whether a sibling still accepts: the
#: longest its clients may wait in the queue at the final stop before it accepts them again.
FINAL_STOP_POLL: Final = 0.05


async def zero_loss_shutdown(
    server: uvicorn.Server,
    stop: ConnectionStop,
    *,
    own_listener: bool,
    sockets: Sequence[socket.socket] | None = None,
) -> None:
    """uvicorn's ``Server.shutdown`` with nothing lost at the socket (the module docstring)."""
    listeners = [sock for listening in server.servers for sock in listening.sockets]
    if own_listener:
        await _take_what_is_queued(listeners)
    for listening in server.servers:
        listening.close()
    for sock in sockets or ():
        sock.close()
    if server.force_exit:  # forced before the listeners closed: cut what they accepted since
        cut_connections(server)
    connections = server.server_state.connections
    logger.info(
        "stop.stopping connections=%d first_byte_grace=%.2f own_listener=%s kinds=%s",
        len(connections),
        stop.first_byte_grace,
        own_listener,
        _kinds(type(connection).__name__ for connection in connections),
    )
    stop.begin(connections)
    overdue = asyncio.get_running_loop().call_later(stop.bound, _abort_overdue, stop, connections)
    try:
        await asyncio.wait_for(
            _uvicorn.wait_tasks_to_complete(server),
            timeout=server.config.timeout_graceful_shutdown,
        )
    except TimeoutError:
        logger.error("stop.cancelled tasks=%d", len(server.server_state.tasks))
        for task in server.server_state.tasks:
            task.cancel(msg="the graceful shutdown's timeout is over")
    finally:
        overdue.cancel()
    await stop.wait_lingering()
    if not server.force_exit:
        await server.lifespan.shutdown()


def _abort_overdue(stop: ConnectionStop, connections: set[Any]) -> None:
    aborted = stop.abort_overdue(connections)
    if aborted:
        logger.warning(
            "stop.overdue_connections aborted=%d kinds=%s: still open %.1f s after the stop "
            "told them to close",
            len(aborted),
            _kinds(aborted),
            stop.bound,
        )


def _kinds(names: Iterable[str]) -> str:
    """``H11Protocol:3,WSProtocol:1``: how many connections of each protocol class."""
    return ",".join(f"{name}:{count}" for name, count in sorted(Counter(names).items())) or "-"


def cut_connections(server: uvicorn.Server) -> None:
    """Abort every open connection of ``server`` (a forced stop)."""
    for connection in list(server.server_state.connections):
        connection.transport.abort()


async def _take_what_is_queued(listeners: Sequence[ListeningSocket]) -> None:
    """Refuse new handshakes, then let the loop accept until every accept queue is empty."""
    if not all([refuse_new_connections(sock) for sock in listeners]):
        logger.warning(
            "stop.no_syn_filter: this platform cannot refuse new handshakes on a listener; "
            "connections still queued when it closes are reset"
        )
        return
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + ACCEPT_QUEUE_TIMEOUT
    # The kernel offers no notification of an empty accept queue, so it is read after each
    # settle: a handshake under way when the filter was attached completes within one round trip.
    while True:
        await asyncio.sleep(HANDSHAKE_SETTLE)
        queued = sum(accept_queue_length(sock) or 0 for sock in listeners)
        if queued == 0:
            return
        if loop.time() > give_up_at:
            logger.warning("stop.accept_queue_not_empty queued=%d", queued)
            return


class ZeroLossServer(uvicorn.Server):
    """uvicorn whose shutdown is :func:`zero_loss_shutdown` (its config's HTTP protocol must be
    :func:`zero_loss_protocol` of ``stop``)."""

    def __init__(self, config: uvicorn.Config, stop: ConnectionStop, *, shared_listener: bool):
        super().__init__(config)
        self.zero_loss_stop = stop
        self.shared_listener = shared_listener
        #: The runtime's signal hook's hold on this server (:meth:`ServerStop.attach`), if any.
        self.server_stop: ServerStop | None = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        own = not self.shared_listener
        if self.server_stop is not None:
            own = await self.server_stop.settle()
        await zero_loss_shutdown(self, self.zero_loss_stop, own_listener=own, sockets=sockets)


@final
class ServerStop:
    """The zero-loss stop of one running uvicorn server, as the runtime's signal hook holds it.

    :meth:`attach` gives a server the user started (``uvicorn app:app``, uvicorn ``--workers``,
    gunicorn's uvicorn worker) the stop: every later connection is made with the zero-loss
    protocol and the server's ``shutdown`` becomes :func:`zero_loss_shutdown`. A server that
    already has it (``serve``, :class:`forgezero_lifecycle.gunicorn.UvicornWorker`) is only held.
    """

    __slots__ = ("_final", "_held", "_server", "_watcher", "shared_listener", "stop")

    def __init__(self, server: uvicorn.Server, stop: ConnectionStop) -> None:
        self._server = server
        self.stop = stop
        #: Whether other processes accept on the listener too; the hook sets it at the signal.
        self.shared_listener = True
        #: This process's own descriptors of the listener it handed over (kept to resume).
        self._held: list[socket.socket] = []
        self._final = False
        self._watcher: asyncio.Task[None] | None = None

    @classmethod
    def attach(cls, server: object) -> ServerStop | None:
        """The stop of ``server`` (a running ``uvicorn.Server``), or None, logged, where this
        uvicorn lacks what it relies on (:mod:`forgezero_lifecycle._internals.uvicorn`)."""
        if not isinstance(server, uvicorn.Server):
            return None
        if isinstance(server, ZeroLossServer):
            server.server_stop = cls(server, server.zero_loss_stop)
            return server.server_stop
        lacking = _uvicorn.missing(server)
        if lacking:
            logger.warning(
                "stop.unavailable uvicorn=%s missing=%s: uvicorn's own stop runs, which resets "
                "connections still queued or idle at the stop",
                _uvicorn.version(),
                ",".join(lacking),
            )
            return None
        config = server.config
        if not config.loaded:
            config.load()
        protocol: Any = config.http_protocol_class
        existing = getattr(protocol, "zero_loss_stop", None)
        if isinstance(existing, ConnectionStop):
            stop = existing
        else:
            stop = ConnectionStop(FIRST_BYTE_GRACE)
            config.http_protocol_class = zero_loss_protocol(protocol, stop)
        held = cls(server, stop)

        async def shutdown(sockets: list[socket.socket] | None = None) -> None:
            _UVICORN_LOG.info("Shutting down")  # uvicorn's own line, which its users look for
            own = await held.settle()
            await zero_loss_shutdown(server, stop, own_listener=own, sockets=sockets)

        server.shutdown = shutdown  # type: ignore[method-assign]
        logger.info("stop.attached uvicorn=%s http=%s", _uvicorn.version(), protocol.__name__)
        return held

    @property
    def serving(self) -> bool:
        """Whether the server has finished its start-up and serves on its listeners."""
        return bool(self._server.started)

    @property
    def bound_itself(self) -> bool:
        """Whether uvicorn bound its listener itself (not ``--fd``, ``--uds`` or inherited)."""
        config = self._server.config
        return config.fd is None and config.uds is None

    def listener_inodes(self) -> set[int]:
        """The inodes of the kernel sockets this server accepts on."""
        inodes: set[int] = set()
        for listening in self._server.servers:
            for sock in listening.sockets:
                with contextlib.suppress(OSError):
                    inodes.add(os.fstat(sock.fileno()).st_ino)
        return inodes

    def hand_over(self) -> int:
        """Stop accepting now and arm every HTTP connection; returns how many were open.

        Only this process's descriptors of the listening socket are closed: the kernel socket
        and its accept queue stay with the processes that still accept on it. One duplicate of
        each is kept, for :meth:`watch_for_final_stop`.
        """
        for listening in self._server.servers:
            for sock in listening.sockets:
                with contextlib.suppress(OSError):
                    self._held.append(socket.socket(fileno=os.dup(sock.fileno())))
            listening.close()
        connections = self._server.server_state.connections
        self.stop.begin(connections, websockets=False)
        count = len(connections)
        logger.info("stop.handover connections=%d", count)
        if self._held and self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch_for_final_stop())
            self._watcher.add_done_callback(_report_crash)
        return count

    async def wait_moved(self, bound: float) -> bool:
        """After :meth:`hand_over`: wait until every connection it armed has moved over (closed,
        or carrying a request the app runs: :meth:`.ConnectionStop.wait_moved`), at most
        ``bound`` seconds; returns whether they all had."""
        try:
            async with asyncio.timeout(bound):
                await self.stop.wait_moved()
        except TimeoutError:
            return False
        return True

    async def _watch_for_final_stop(self) -> None:
        """After :meth:`hand_over`: once no other process accepts on the listener, nor will
        again, accept on it again (the module docstring); until then, or until :meth:`settle`."""
        inodes = {os.fstat(sock.fileno()).st_ino for sock in self._held}
        # Polled: the kernel tells nobody when another process stops watching a listener.
        while not self._is_final(inodes):  # noqa: ASYNC110
            await asyncio.sleep(FINAL_STOP_POLL)
        await self._resume()

    async def settle(self) -> bool:
        """At the server's shutdown: whether this process is to treat the listener as its own
        (its own listener, or the final stop of a shared one). Ends the watch; a listener kept
        for nothing is closed."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None and not watcher.done():
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        if not self.shared_listener:
            return True
        if self._held and not self._final:
            inodes = {os.fstat(sock.fileno()).st_ino for sock in self._held}
            if self._is_final(inodes):
                await self._resume()
        held, self._held = self._held, []
        if not self._final:
            for sock in held:
                sock.close()
        return self._final

    def _is_final(self, inodes: set[int]) -> bool:
        """No sibling accepts on the listener, and none can start to: gunicorn's arbiter closed
        its listener (it does so only at its final stop), or the parent is uvicorn's own
        multi-process supervisor, which replaces a worker only once the replacement is ready
        and so stops every worker at once only at its final stop (a uvicorn whose reload stops
        the old worker before it starts the new one cannot tell a reload from it: never)."""
        if accepting_elsewhere(inodes):
            return False
        if self._server.config.workers > 1:
            return _uvicorn.reload_waits_for_ready()
        return not parent_holds(inodes)

    async def _resume(self) -> None:
        """Accept on the kept listener again, the way ``Server.startup`` does
        (:mod:`forgezero_lifecycle._internals.uvicorn`);
        every connection made from now on is armed, since the stop has begun."""
        server = self._server
        await _uvicorn.accept_on(server, self._held)
        self._held = []
        self._final = True
        self.shared_listener = False
        logger.info(
            "stop.final_stop listeners=%d: no other process accepts on the listener any more; "
            "this one accepts again, answers with Connection: close and empties the queue",
            len(server.servers),
        )

    def close_after_responses(self) -> None:
        """Close every connection whose response is under way once that response ends (for
        responses that started before a drain and so cannot carry ``Connection: close``)."""
        for connection in list(self._server.server_state.connections):
            cycle = getattr(connection, "cycle", None)
            if cycle is not None and not cycle.response_complete:
                close_after_response(connection, cycle)


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error(
            "stop.final_stop_failed: the listener is left to the other processes",
            exc_info=task.exception(),
        )
