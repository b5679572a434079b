"""The zero-loss stop of a uvicorn server: ``serve``'s, the gunicorn worker class's, and the one
the runtime's signal hook gives a uvicorn the user runs.

Once the drain has settled (:func:`zero_loss_shutdown`):

1. an own listener refuses new handshakes (:func:`.sockets.refuse_new_connections`) and is
   accepted from until its accept queue is empty, then closed; a shared listener (other
   processes accept on it: ``uvicorn --workers``, gunicorn, ``serve --workers``) is only no
   longer accepted from, and keeps its queue for them;
2. every connection gets the first-byte grace or closes after its response
   (:class:`.connections.ConnectionStop`), each closed the lingering way;
3. then uvicorn's own wait for connections and tasks, and the lifespan shutdown; a WebSocket
   session still open at the stop's bound (:attr:`.connections.ConnectionStop.bound`) is aborted
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
(:func:`._proc.accepting_elsewhere`: its event loop watches the listener). Once none does, and no sibling can start accepting again (gunicorn's arbiter has
closed its listener, which it does only at its final stop; uvicorn's parent starts no worker at
its final stop), the stop is the final one: the worker accepts again, answers every request with
``Connection: close`` (the drain refuses them with 503 once intake is closed), and its shutdown
treats the listener as its own (step 1 above: new handshakes refused, the queue emptied).
Several workers may all conclude so at once: each keeps accepting until the queue is empty after
the filter is attached, so the last one to close leaves nothing queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Final, final

import uvicorn

from .._internals import uvicorn as _uvicorn
from ._proc import accepting_elsewhere, parent_holds
from .connections import ConnectionStop, close_after_response, zero_loss_protocol
from .sockets import ListeningSocket, accept_queue_length, refuse_new_connections

__all__ = [
    "FIRST_BYTE_GRACE",
    "HANDOVER_GRACE",
    "ServerStop",
    "ZeroLossServer",
    "cut_connections",
    "zero_loss_shutdown",
]

logger = logging.getLogger("forgezero_lifecycle.stop")
_UVICORN_LOG: Final = logging.getLogger("uvicorn.error")

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
    :func:`.connections.zero_loss_protocol` of ``stop``)."""

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
