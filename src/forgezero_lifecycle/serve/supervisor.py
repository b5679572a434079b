"""``serve --workers N``: a supervisor holding the listening socket for generations of N workers.

::

    supervisor (holds the listening socket: bound once, or from systemd; never accepts on it)
      ├── generation g   : worker 0..N-1  (fresh processes, private channels)
      └── generation g+1 : started on SIGHUP or `forgezero-lifecycle reload`, same socket

* **Start**: every worker of generation 1 must report ready within ``--start-timeout``, or the
  supervisor stops them and exits 1, saying which worker failed and why.
* **One drain**: a drain begun through any worker's control plane, or by SIGTERM/SIGINT to the
  supervisor, reaches every worker of the generation at once (:mod:`.generation`).
* **Stop** (SIGTERM/SIGINT): drain the current generation (or follow a drain an orchestrator
  began), then refuse new connections at the socket, wait (bounded) until the workers have
  accepted everything queued, stop the workers and close the socket. Exit 0 when drained, 1
  otherwise; a second signal forces the stop.
* **Handover** (SIGHUP): start generation g+1 on the same socket with the revision read now
  (``--revision-file`` / ``--revision-command``); if any of its workers fails to start or is not
  ready in time, stop it and keep g serving untouched. Otherwise g's workers stop accepting and
  close their keep-alive connections (each after its response in flight), and after
  ``--handover-grace`` g is drained (its jobs released under their fences) and stopped. One
  handover at a time: a SIGHUP during one is refused and logged.
* **Workers that die** while their generation serves are replaced (logged with the exit reason);
  a worker dying during a drain fails that drain.

A worker notices when the supervisor is gone (end of file on its channel, parent-death signal)
and stops, so nothing is left running even after SIGKILL of the supervisor.

State (when the app has a state adapter): worker k of g hands its state to worker k of g+1 once
g is drained (:mod:`.handoff`); a handover whose state cannot be handed over is refused before g
is touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import logging.config
import secrets
import signal
import time
from collections.abc import Coroutine, Sequence
from typing import Any, Final, TypeVar, final

from .._errors import ConfigurationError
from ..core.self_drain import UNKNOWN_REVISION
from ..wire.drain import DRAIN_PROTOCOL, MAX_DRAIN_TIMEOUT_MS, MIN_DRAIN_TIMEOUT_MS, DrainState
from .generation import Generation
from .handoff import hand_state_over, state_refusal
from .handovers import Handover, HandoverLog
from .listeners import Listener, held_listeners
from .options import ServeOptions, read_revision
from .process import StartFailedError, WorkerProcess
from .server import SHUTDOWN_MARGIN, log_config
from .sockets import accept_queue_length, refuse_new_connections

__all__ = ["Supervisor", "run_supervisor"]

logger = logging.getLogger("forgezero_lifecycle.serve.supervisor")

T = TypeVar("T")

#: How long the stop waits for the workers to accept what the socket had queued.
QUEUE_EMPTY_BOUND: Final = 5.0
_QUEUE_LOOK: Final = 0.01
#: A generation that never became ready has nothing to drain: it gets this long to stop.
UNREADY_STOP_BOUND: Final = 3.0
REPLACE_BACKOFF: Final = (0.5, 1.0, 2.0, 5.0, 10.0)


def run_supervisor(app: str, options: ServeOptions) -> int:
    """Bind (or inherit) the sockets, run generations until stopped; the exit code."""
    logging.config.dictConfig(log_config(options.log_level))
    if options.control_token is None and not options.insecure_loopback_control:
        raise ConfigurationError(
            detail="serve --workers needs a control token (FORGEZERO_CONTROL_TOKEN or "
            "--token-file), or --insecure-loopback-control for local development"
        )
    if options.revision_file is not None and options.revision_command is not None:
        raise ConfigurationError(detail="give --revision-file or --revision-command, not both")
    first = read_revision(options)  # a bad revision source fails before anything is bound
    listeners = held_listeners(options.host, options.port)
    try:
        return asyncio.run(Supervisor(app, options, listeners, first).run())
    finally:
        for listener in listeners:
            listener.sock.close()


@final
class Supervisor:
    """Generations of workers on held sockets; signals drive stop and handover."""

    def __init__(
        self,
        app: str,
        options: ServeOptions,
        listeners: Sequence[Listener],
        first_revision: str | None,
    ) -> None:
        self._app = app
        self._options = options
        self._listeners = listeners
        self._first_revision = first_revision
        self._number = 0
        self.current: Generation | None = None
        self._generations: list[Generation] = []
        self._stopping: asyncio.Task[None] | None = None
        self._handover: asyncio.Task[None] | None = None
        self.handovers = HandoverLog()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._done = asyncio.Event()
        self._exit = 1

    def _new_generation(self, revision: str | None) -> Generation:
        self._number += 1
        options = dataclasses.replace(self._options, revision=revision)
        generation = Generation(
            self._number,
            app=self._app,
            options=options,
            listeners=[listener.sock for listener in self._listeners],
            on_lost=self._replace,
            on_reload=self.reload,
            handovers=self.handovers,
        )
        self._generations.append(generation)
        return generation

    def _spawn(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @property
    def _stop_bound(self) -> float:
        return self._options.drain_timeout + SHUTDOWN_MARGIN

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_stop_signal, signum)
        loop.add_signal_handler(signal.SIGHUP, self._on_reload_signal)
        try:
            generation = self._new_generation(self._first_revision)
            try:
                await generation.start()
            except StartFailedError as error:
                logger.error("supervisor.start_failed: %s", error)
                await generation.stop(UNREADY_STOP_BOUND)
                return 1
            self.current = generation
            where = ", ".join(listener.describe() for listener in self._listeners)
            logger.info(
                "supervisor.serving generation=%d pids=%s on %s",
                generation.number,
                generation.pids,
                where,
            )
            await self._done.wait()
            return self._exit
        finally:
            for signum in handled:
                loop.remove_signal_handler(signum)
            for task in list(self._tasks):
                task.cancel()
            for leftover in self._generations:
                await leftover.stop(1.0, force=True)

    # Stop.

    def _on_stop_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.current is None:  # still starting: nothing serves yet, nothing to drain
            logger.warning("supervisor.signal signal=%s during the start: stopping", name)
            self._stopping = self._spawn(self._force())
            return
        if self._stopping is None:
            logger.info(
                "supervisor.signal signal=%s: draining within %.1f s",
                name,
                self._options.drain_timeout,
            )
            self._stopping = self._spawn(self._drain_and_stop())
        else:
            logger.warning("supervisor.forced signal=%s: stopping now", name)
            self._stopping.cancel()
            self._spawn(self._force())

    async def _force(self) -> None:
        self._exit = 1
        await asyncio.gather(*(g.stop(2.0, force=True) for g in self._generations))
        self._done.set()

    async def _drain_and_stop(self) -> None:
        if self._handover is not None and not self._handover.done():
            logger.info("supervisor.handover_cancelled: stopping instead")
            self._handover.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._handover
        generation = self.current
        assert generation is not None
        state = await drain(generation, self._options.drain_timeout)
        logger.info("supervisor.drain_settled generation=%d state=%s", generation.number, state)
        await self._empty_the_queue()
        await generation.stop(self._stop_bound)
        logger.info("supervisor.stopped drain=%s", state)
        self._exit = 0 if state == "drained" else 1
        self._done.set()

    async def _empty_the_queue(self) -> None:
        """New connections are refused at the socket; the workers accept what is queued."""
        socks = [listener.sock for listener in self._listeners]
        if not all([refuse_new_connections(sock) for sock in socks]):
            logger.warning(
                "supervisor.no_syn_filter: this platform cannot refuse new handshakes on a "
                "listener; connections still queued when it closes are reset"
            )
            return
        deadline = time.monotonic() + QUEUE_EMPTY_BOUND
        while any(accept_queue_length(sock) for sock in socks):
            if time.monotonic() > deadline:
                logger.warning("supervisor.queue_not_empty after %.1f s", QUEUE_EMPTY_BOUND)
                return
            await asyncio.sleep(_QUEUE_LOOK)  # the kernel offers no event for an empty queue

    # Workers that die.

    def _replace(self, lost: WorkerProcess) -> None:
        logger.warning(
            "supervisor.worker_lost %s reason=%s: starting a replacement",
            lost.name,
            lost.exit_reason,
        )
        self._spawn(self._start_replacement(lost))

    async def _start_replacement(self, lost: WorkerProcess) -> None:
        generation = lost.generation
        for pause in (0.0, *REPLACE_BACKOFF):
            await asyncio.sleep(pause)
            if generation.retired or generation.controller.active or self._stopping is not None:
                return
            fresh = generation.replace(lost)
            try:
                await generation.start_worker(fresh)
            except StartFailedError as error:
                logger.error("supervisor.replacement_failed: %s", error)
                fresh.stopping = True
                fresh.signal(signal.SIGKILL)
                continue
            logger.info("supervisor.worker_replaced %s", fresh.name)
            return

    # Handover.

    def _on_reload_signal(self) -> None:
        if not self.reload():
            logger.warning("supervisor.reload_refused: a handover or the stop is running")

    def reload(self) -> int | None:
        """Begin a handover to a new generation and return its number (for
        ``supervisor/v1/handover``); None when one (or the stop) is running."""
        if self._stopping is not None or self.current is None:
            return None
        if self._handover is not None and not self._handover.done():
            return None
        handover = self.handovers.begin(self.current.number)
        self._handover = self._spawn(self._hand_over(self.current, handover))
        return handover.number

    async def _hand_over(self, old: Generation, handover: Handover) -> None:
        try:
            aborted = await self._try_hand_over(old, handover)
        except Exception as error:
            logger.exception("supervisor.handover_crashed: %r keeps serving", old)
            aborted = f"the handover crashed ({type(error).__name__}); see the supervisor's log"
        handover.end("done" if aborted is None else "aborted", aborted)

    async def _try_hand_over(self, old: Generation, handover: Handover) -> str | None:
        """Hand over from ``old``; None when done, else why it was aborted (``old`` serves on)."""
        began = time.monotonic()
        try:
            revision = read_revision(self._options)
        except ConfigurationError as error:
            logger.error("supervisor.handover_aborted: %s; %r keeps serving", error.detail, old)
            return f"the revision could not be read: {error.detail}"
        new = self._new_generation(revision)
        handover.to_generation = new.number
        logger.info(
            "supervisor.handover_begin from=%d to=%d revision=%s", old.number, new.number, revision
        )
        try:
            await new.start()
        except StartFailedError as error:
            await new.stop(UNREADY_STOP_BOUND)
            logger.error("supervisor.handover_aborted: %s; %r keeps serving", error, old)
            return f"generation {new.number} did not start: {error}"
        refusal = state_refusal(old, new, self._options)
        if refusal is not None:
            logger.error("supervisor.handover_refused: %s; %r keeps serving", refusal, old)
            await new.stop(self._stop_bound)
            return f"generation {new.number} cannot take the state: {refusal}"
        self.current = new
        logger.info("supervisor.new_generation_ready generation=%d pids=%s", new.number, new.pids)
        await asyncio.gather(*(worker.command("stop_accepting") for worker in old.workers))
        await asyncio.sleep(self._options.handover_grace)
        state = await drain(old, self._options.drain_timeout, target=revision)
        if old.workers[0].state_kind is not None:
            await hand_state_over(old, new, self._options)
        await old.stop(self._stop_bound)
        logger.info(
            "supervisor.handover_done from=%d to=%d old_drain=%s seconds=%.2f",
            old.number,
            new.number,
            state,
            time.monotonic() - began,
        )
        return None


async def drain(generation: Generation, timeout: float, *, target: str | None = None) -> DrainState:
    """Drain ``generation`` under one deadline (or follow the drain already begun)."""
    if not generation.controller.active:
        timeout_ms = min(MAX_DRAIN_TIMEOUT_MS, max(MIN_DRAIN_TIMEOUT_MS, round(timeout * 1000)))
        generation.begin(
            {
                "protocol": DRAIN_PROTOCOL,
                "nonce": secrets.token_urlsafe(32),
                "sourceRevision": generation.revision or UNKNOWN_REVISION,
                "targetRevision": target or UNKNOWN_REVISION,
                "timeoutMs": timeout_ms,
            }
        )
        await generation.acknowledged()
    else:
        logger.info("supervisor.following_drain generation=%d", generation.number)
    return await generation.controller.wait()
