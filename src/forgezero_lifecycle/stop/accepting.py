"""Accepting on a listening socket that sibling processes accept on too: one connection a wake-up.

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
``wait_closed``), so uvicorn's own shutdown and :func:`.server.zero_loss_shutdown` stop it the
same way: ``close`` stops this process accepting and closes its descriptor only; the kernel
socket and its queue stay with the processes that hold it. A connection accepted just before
``close`` is still made (its protocol sees the stop already begun, as with asyncio's server).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import mmap
import os
import socket
import ssl
import struct
import tempfile
from collections.abc import Callable, Sequence
from typing import IO, Final, final

import uvicorn

from .._internals import uvicorn as _uvicorn
from .sockets import accept_queue_length

__all__ = [
    "ACCEPT_RETRY_DELAY",
    "DEFER_LIMIT",
    "DEFER_POLL",
    "SLACK",
    "SharedListener",
    "Tally",
    "accept_one_at_a_time",
    "may_accept",
]

logger = logging.getLogger("forgezero_lifecycle.stop")

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
