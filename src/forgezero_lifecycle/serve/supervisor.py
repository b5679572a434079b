"""``serve --workers N``: a supervisor holding the listening socket for generations of N workers.

::

    supervisor (holds the listening socket: bound once, or from systemd; never accepts on it)
      ├── generation g   : worker 0..N-1  (fresh processes, private channels)
      └── generation g+1 : started on SIGHUP or `forgezero-lifecycle reload`, same socket

What to do is decided by :class:`~forgezero_lifecycle.serve.machine.SupervisorMachine` (the
table of every phase and event is :data:`~forgezero_lifecycle.serve.machine.TABLE`); this module
only turns signals, process exits, channel reports and timers into its events and carries out
its actions. An action that would start something, decided before a stop, is dropped when its
turn comes after the stop (a worker it would have started is reported as never started).

A failure of the supervisor's own code ends it: an event the table rules out, an action that
raises, or its answer to a worker's channel message that raises (``supervisor.failed``, naming
the cause). Its workers are told to stop at once (:data:`FORCED_STOP_BOUND`, then SIGKILL) and
``serve`` exits 1 with :class:`SupervisorFailedError` (the machine would otherwise go on
believing the failed step was done).

* **Start**: every worker of generation 1 must report ready within ``--start-timeout``, or the
  supervisor stops them and exits 1, saying which worker failed and why. No worker accepts on
  the shared socket before all of them are ready: until then connections wait in the kernel's
  accept queue (so the first ready worker does not take a whole burst of keep-alive clients).
* **One drain**: a drain begun through any worker's control plane, or by SIGTERM/SIGINT to the
  supervisor, reaches every worker of the generation at once (:mod:`.workers`).
* **Stop** (SIGTERM/SIGINT): drain every generation that accepted work (during a handover g and
  g+1 alike), all begun at once under one deadline (or follow a drain an orchestrator began),
  then refuse new connections at the socket, wait (bounded) until the workers have accepted
  everything queued, stop the workers and close the socket. Exit 0 only when every one drained,
  1 otherwise; a second signal forces the stop.
* **Handover** (SIGHUP): start generation g+1 on the same socket with the revision read now
  (``--revision-file`` / ``--revision-command``); if any of its workers fails to start or is not
  ready in time, stop g+1 (whose workers never accepted) and keep g serving untouched.
  Otherwise g+1 accepts alongside g and must prove it serves (:meth:`Supervisor._prove`): each
  of its workers answers :data:`PROOF_PROBES` probes in a row through its own HTTP server after
  its accept, each within :data:`PROBE_BOUND`, all within ``--start-timeout``. Not proved in
  time (an event loop blocked right after the accept, a worker lost): the handover is abandoned
  (``RUNTIME_HANDOVER_NOT_PROVED``), g+1's workers hand their clients back and drain on their
  own bound, and g serves on untouched. Proved: g's workers stop accepting and close their
  keep-alive connections (each after its response in flight), and after ``--handover-grace`` g
  is drained (its jobs released under their fences) and stopped. One handover at a time: a
  SIGHUP during one is refused and logged.
* **Workers that die** while their generation serves are replaced (logged with the exit
  reason); never into a generation that stopped accepting, nor during the stop. A worker dying
  during a drain fails that drain; a worker not ready when the drain began is not part of it
  (it admitted nothing). One lost while an orchestrator's drain holds the generation is
  replaced too, and the replacement joins that drain before it accepts (intake refused, the
  nonce answered, the rollback reaches it), so a rollback finds every worker again.

Every task the supervisor starts (timers, the watch on each worker process, the state transfer)
belongs to the task group :meth:`Supervisor.run` opens: one that fails ends the supervisor with
its error, and no worker outlives it, instead of the failure going unseen while the machine
waits for an event that task would have reported.

A worker notices when the supervisor is gone (end of file on its channel, parent-death signal)
and stops, so nothing is left running even after SIGKILL of the supervisor.

State (when the app has a state adapter): worker k of g hands its state to worker k of g+1, once
g is drained (so the export is final), through the state export protocol over a private loopback
listener each worker has of its own, with the handoff token (:func:`hand_state_over`).
Generations have the same number of workers; a handover whose new workers have no adapter,
another protocol or schema version, or that has no handoff token is refused before g is touched
(logged; g keeps serving: the refusal is :func:`~.machine.state_refusal`). The new generation
serves while the state is on its way: an adapter's import must merge with what the new worker
did meanwhile (a counter adds). One deadline bounds each worker's transfer: the drain's
(``--drain-timeout``). The new worker's import (the fetch of the export, however slow the old
worker's adapter, and the import) gives up when it passes, and the supervisor waits for its
answer that long plus the channel's usual bound (:func:`~.workers.answer_bound`), so an
export that arrives in time is never logged as failed.

Each reload (SIGHUP or ``POST supervisor/v1/reload``) begins one :class:`Handover`, numbered from
1, kept in a :class:`HandoverLog` that ``supervisor/v1/handover`` answers from; it is
``running`` until generation g+1 serves and g is gone (``done``), or until g+1 could not start,
could not take g's state or did not prove it serves and g serves on, or until the stop ended it
(``aborted``, with a code and the reason). The most recent :data:`RECENT` are kept, so
``forgezero-lifecycle reload`` can wait for the one it began even if another reload follows.
With ``opentelemetry-api`` installed (the ``[otel]`` extra) each handover is also a span
``forgezero.handover`` on the global tracer provider: one event per step the supervisor takes
while it runs (``start generation``, ``accept``, ``prove``, ``stop accepting``, ``begin
drain``...), and the drain of the generation it retires (the supervisor's drain over every
worker) as its child ``forgezero.drain`` (:mod:`forgezero_lifecycle.otel`).

The generation-wide control paths (the drain paths, ``schedules``, ``metrics`` and
``supervisor/v1/*``) are checked by the worker that receives them (its runtime's own
:class:`~forgezero_lifecycle.asgi.control.ControlApp`, :class:`~.worker.GenerationControl`) and
answered here by :class:`ForwardedControl`, one per generation: the drain calls from the
generation's drain controller, with the per-worker picture in ``detail`` (``status`` and
``rollback`` from whichever generation the supervisor still knows holds the nonce, and a
``begin`` reaching a generation that a handover is retiring refused with
``RUNTIME_DRAIN_GENERATION_RETIRING``); ``schedules`` and ``metrics`` from every worker,
labelled with its worker (and the supervisor's own counters after them); ``reload`` begins a
handover and answers with its number; ``handover`` from the :class:`HandoverLog`; ``scale``
adds or removes one worker and answers the size; ``status`` is the supervisor's own. A metrics
scrape needs no token, so the supervisor fans one out to the workers at a time and reuses its
merged scrape for :data:`METRICS_REUSE` seconds.

* **One worker at a time** (recycling, the watchdog, scaling), as a handover of one worker: a
  worker past ``--max-requests`` (with its jitter), ``--max-worker-memory`` or
  ``--max-worker-lifetime`` reports it (:class:`~.worker.LimitWatch`); a worker whose event
  loop does not answer the heartbeat (``--worker-timeout``) is noticed here; SIGTTIN, SIGTTOU and
  ``POST supervisor/v1/scale`` change the generation's size. The replacement starts, is ready
  and accepts; only then does the worker it replaces stop accepting, ask its keep-alive clients
  to reconnect (``--handover-grace``) and drain under its own bound, or, unresponsive, get
  killed (what it held is logged). A removed worker hands over and drains the same way. Not
  during a handover or a stop. Each is logged (``supervisor.worker_replacing``,
  ``supervisor.worker_replaced``), counted in the metrics scrape
  (``forgezero_supervisor_worker_replacements_total``) and in ``supervisor/v1/status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import signal
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, final
from urllib.parse import urlencode

import orjson

from .._clock import Clock, SystemClock
from .._errors import (
    ConfigurationError,
    ControlPathNotFoundError,
    DrainConflictError,
    DrainNotFoundError,
    DrainRequestInvalidError,
    LifecycleError,
    ReloadBusyError,
    ScaleRefusedError,
)
from ..asgi.control import error_answer
from ..core.drain import DrainController
from ..core.self_drain import UNKNOWN_REVISION
from ..stop.sockets import accept_queue_length, refuse_new_connections
from ..wire import paths
from ..wire._protocol import deadline_ms
from ..wire.supervisor import (
    HandoverFailure,
    HandoverState,
    HandoverStatus,
    ReloadAccepted,
    ScaleAccepted,
)
from . import machine as m
from .listeners import Listener, held_listeners
from .options import ServeOptions, configure_logging, read_revision
from .server import SHUTDOWN_MARGIN, log_config
from .workers import Generation, WorkerHandle

__all__ = [
    "METRICS_REUSE",
    "RECENT",
    "ForwardedControl",
    "Handover",
    "HandoverLog",
    "Supervisor",
    "SupervisorFailedError",
    "hand_state_over",
    "run_supervisor",
]


if TYPE_CHECKING:
    from opentelemetry.trace import Span, TracerProvider

logger = logging.getLogger("forgezero_lifecycle.serve.supervisor")


#: How long the stop waits for the workers to accept what the socket had queued.
QUEUE_EMPTY_BOUND: Final = 5.0
_QUEUE_LOOK: Final = 0.01
#: Workers that never accepted have nothing to drain: they get this long to stop.
UNREADY_STOP_BOUND: Final = 3.0
#: A forced stop (the second signal): this long, then SIGKILL.
FORCED_STOP_BOUND: Final = 2.0
#: The longest pause between two heartbeats of a worker (``--worker-timeout``; half of it when
#: that is shorter).
HEARTBEAT_INTERVAL: Final = 1.0
#: A handover's new worker proves it serves by answering this many probes in a row (through
#: its own HTTP server, :meth:`~.workers.WorkerHandle.probe`) after its accept, one every
#: :data:`PROBE_INTERVAL`, each within :data:`PROBE_BOUND`: an event loop that blocks right
#: after its accept fails one. The shared listener cannot be aimed at one process (the kernel
#: hands a connection to whichever worker accepts first, the old generation's included), so
#: each worker is asked on its private listener, which the same server and event loop answer.
PROOF_PROBES: Final = 5
PROBE_INTERVAL: Final = 0.1
PROBE_BOUND: Final = 1.0
#: The code of a handover abandoned because its new generation did not prove it serves.
NOT_PROVED: Final = "RUNTIME_HANDOVER_NOT_PROVED"
#: Unresponsive workers kept for ``supervisor/v1/status``.
RECENT_UNRESPONSIVE: Final = 16
_SCALE_SIGNALS: Final = {signal.SIGTTIN: 1, signal.SIGTTOU: -1}


class _NotProvedError(Exception):
    """A worker of a handover's new generation cannot prove it serves (it did not accept, or it
    exited): the proof ends now (why: in the list the proof keeps)."""


class SupervisorFailedError(RuntimeError):
    """The supervisor's own code failed (an action or a channel handler raised); its message
    names the cause. Its workers were stopped; ``serve`` exits 1."""


def run_supervisor(app: str, options: ServeOptions) -> int:
    """Bind (or inherit) the sockets, run generations until stopped; the exit code."""
    configure_logging(options.uvicorn, log_config(options.log_level, "supervisor"))
    if options.control_token is None and not options.insecure_loopback_control:
        raise ConfigurationError(
            detail="serve --workers needs a control token (FORGEZERO_CONTROL_TOKEN or "
            "--token-file), or --insecure-loopback-control for local development"
        )
    if options.revision_file is not None and options.revision_command is not None:
        raise ConfigurationError(detail="give --revision-file or --revision-command, not both")
    first = read_revision(options)  # a bad revision source fails before anything is bound
    flags = options.uvicorn
    listeners = held_listeners(
        options.host, options.port, uds=flags.uds, fd=flags.fd, backlog=flags.backlog
    )
    try:
        return asyncio.run(Supervisor(app, options, listeners, first).run())
    finally:
        for listener in listeners:
            listener.close()


@final
class Supervisor:
    """The I/O of the supervisor: it reports what happens to a
    :class:`~forgezero_lifecycle.serve.machine.SupervisorMachine` and carries out the actions
    it answers, in order (one batch after the other)."""

    def __init__(
        self,
        app: str,
        options: ServeOptions,
        listeners: Sequence[Listener],
        first_revision: str | None,
    ) -> None:
        assert options.workers is not None
        self._app = app
        self._options = options
        self._listeners = listeners
        self._first_revision = first_revision
        self.machine = m.SupervisorMachine(
            options.workers, state_token=options.handoff_token is not None
        )
        #: The generations the machine still knows (a stopped one is dropped with it).
        self._generations: dict[int, Generation] = {}
        self.handovers = HandoverLog()
        self._records: dict[int, Handover] = {}
        #: Each batch of actions with the number of stops begun when it was decided.
        self._batches: asyncio.Queue[tuple[int, list[m.Action]]] = asyncio.Queue()
        #: The supervisor's tasks, all owned by the task group :meth:`run` opens (kept here too,
        #: to cancel them when the machine says exit: a task group cannot cancel its tasks).
        self._group: asyncio.TaskGroup | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._done = asyncio.Event()
        self._exit = 1
        self._began_handover = 0.0
        #: What ended the supervisor: an impossible event, a failed action or channel handler.
        self._failure: Exception | None = None
        #: Worker replacements done (by kind), given up, the one running, unresponsive workers.
        self._replaced: Counter[str] = Counter()
        self._given_up = 0
        self._replacing: str | None = None
        self._unresponsive: deque[dict[str, Any]] = deque(maxlen=RECENT_UNRESPONSIVE)
        self._unresponsive_count = 0

    @property
    def current(self) -> Generation | None:
        number = self.machine.current
        return None if number is None else self._generations.get(number)

    @property
    def _stop_bound(self) -> float:
        return self._options.drain_timeout + SHUTDOWN_MARGIN

    def _spawn(self, work: Coroutine[Any, Any, object]) -> None:
        """Run ``work`` in :meth:`run`'s task group: if it fails, the supervisor fails with it."""
        if self._group is None:  # run() has ended: a late report (its crash path) starts nothing
            work.close()
            return
        task = self._group.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on(self, event: m.Event) -> list[m.Action]:
        """Report ``event``: the machine decides, the actions are queued (carried out in order).
        An event the machine's table rules out ends the supervisor (its workers are killed)."""
        try:
            actions = self.machine.handle(event)
        except m.ImpossibleEventError as error:
            logger.critical("supervisor.impossible_event: %s", error)
            self._fail(error)
            return []
        if actions:
            self._batches.put_nowait((self.machine.stops, actions))
        return actions

    def _fail(self, error: Exception) -> None:
        """End the supervisor with ``error`` (the first one counts): :meth:`run` stops the
        workers and raises it."""
        if self._failure is None:
            logger.critical("supervisor.failed: %s; its workers are stopped", error)
            self._failure = error
        self._done.set()

    def _handler_failed(
        self, worker: WorkerHandle, message: dict[str, Any], error: Exception
    ) -> None:
        what = message.get("call", message.get("op", message.get("event")))
        self._fail(
            SupervisorFailedError(
                f"the answer to {what!r} from {worker.name} failed: {type(error).__name__}: {error}"
            )
        )

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, *_SCALE_SIGNALS)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_stop_signal, signum)
        loop.add_signal_handler(signal.SIGHUP, self._on_reload_signal)
        for signum, by in _SCALE_SIGNALS.items():
            loop.add_signal_handler(signum, self._on_scale_signal, signum, by)
        self._batches.put_nowait((0, self.machine.start()))
        try:
            async with asyncio.TaskGroup() as self._group:
                self._spawn(self._carry_out())
                await self._done.wait()
                for task in list(self._tasks):
                    task.cancel()
        except Exception:
            logger.exception("supervisor.crashed: a bug in the supervisor; its workers are stopped")
            raise
        finally:
            self._group = None
            for signum in handled:
                loop.remove_signal_handler(signum)
            await self._stop_leftovers()
            generations = list(self._generations.values())
            await asyncio.gather(*(generation.aclose_preload() for generation in generations))
            for generation in generations:
                generation.close()
        if self._failure is not None:
            raise self._failure
        return self._exit

    async def _stop_leftovers(self) -> None:
        """Only after a failure of the supervisor's own code: nothing may outlive it. Every
        worker still running is told to stop now, and killed :data:`FORCED_STOP_BOUND` later;
        one that has finished its stop by then (its channel closed: it only runs its exit
        steps, an exporter's or a coverage tool's flush say) is given that long once more."""
        running = [
            worker
            for generation in self._generations.values()
            for worker in generation.workers
            if worker.running
        ]
        processes = [worker.process for worker in running if worker.process is not None]
        for worker in running:
            logger.error("supervisor.worker_stopped %s: the supervisor ends", worker.name)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FORCED_STOP_BOUND):
                await asyncio.gather(*(worker.command("stop", force=True) for worker in running))
                await asyncio.gather(*(process.wait() for process in processes))
        leaving = [
            worker.process
            for worker in running
            if worker.running and worker.channel is not None and worker.channel.closed.is_set()
        ]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FORCED_STOP_BOUND):
                await asyncio.gather(*(process.wait() for process in leaving if process))
        for worker in running:
            if worker.running:
                logger.error("supervisor.worker_killed %s: not stopped in time", worker.name)
                worker.signal(signal.SIGKILL)
        await asyncio.gather(*(process.wait() for process in processes))

    async def _carry_out(self) -> None:
        while True:
            stops, batch = await self._batches.get()
            for action in batch:
                try:
                    if self.machine.outdated(action, stops):
                        self._drop(action)
                    else:
                        await self._act(action)
                except Exception as error:
                    logger.exception("supervisor.action_failed %s", action)
                    self._fail(
                        SupervisorFailedError(
                            f"the action {action} failed: {type(error).__name__}: {error}"
                        )
                    )
                    return

    def _drop(self, action: m.Action) -> None:
        """``action`` was decided before the stop: a worker it would start never starts."""
        logger.info("supervisor.action_dropped %s: decided before the stop", action)
        match action:
            case m.StartGeneration(generation=number, workers=workers):
                for worker in self._new_generation(number, None).prepare(workers):
                    worker.never_started()
            case m.StartWorker(generation=number, index=index):
                self._generations[number].forgo_worker(index).never_started()
            case _:
                pass  # a state transfer: the stop ended the handover it belonged to

    # Events from the outside.

    def _on_stop_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        phase = self.machine.phase
        if phase is m.Phase.STARTING:
            logger.warning("supervisor.signal signal=%s during the start: stopping", name)
        elif phase is m.Phase.STOPPING:
            logger.warning("supervisor.forced signal=%s: stopping now", name)
        else:
            logger.info(
                "supervisor.signal signal=%s: draining within %.1f s",
                name,
                self._options.drain_timeout,
            )
        self._on(m.StopSignal(name))

    def _on_reload_signal(self) -> None:
        self.reload()

    def reload(self) -> int | str:
        """Begin a handover to a new generation and return its number (for
        ``supervisor/v1/handover``), or why it is refused (a handover, a drain or the stop runs)."""
        why = "the supervisor failed"
        for action in self._on(m.Reload()):
            if isinstance(action, m.HandoverBegun):
                return action.number
            if isinstance(action, m.Refused):
                why = action.why
        return why

    def _on_scale_signal(self, signum: int, by: int) -> None:
        logger.info("supervisor.signal signal=%s: scale by %+d", signal.Signals(signum).name, by)
        self.scale(by)

    def scale(self, by: int) -> int | str:
        """Add (``by=1``) or remove (``-1``) one worker of the generation that serves; the size
        from now on (for ``supervisor/v1/scale``), or why it is refused."""
        why = "the supervisor failed"
        for action in self._on(m.Scale(by)):
            if isinstance(action, m.Scaled):
                return action.workers
            if isinstance(action, m.Refused):
                why = action.why
        return why

    def _limit_reached(self, worker: WorkerHandle, why: str) -> None:
        logger.info("supervisor.worker_limit %s: %s", worker.name, why)
        self._on(m.LimitReached(worker.generation, worker.index, why))

    async def _heartbeat(self, worker: WorkerHandle) -> None:
        """Ask the worker's event loop every so often; one that does not answer within
        ``--worker-timeout`` is reported unresponsive (once), with what it held."""
        timeout = self._options.worker_timeout
        assert timeout is not None
        while True:
            await asyncio.sleep(min(timeout / 2, HEARTBEAT_INTERVAL))
            answered = await worker.ping(timeout)
            if answered is None:
                return  # gone
            if answered:
                continue
            why = f"its event loop did not answer within {timeout:g} s"
            held = " ".join(f"{kind}={count}" for kind, count in sorted(worker.in_flight.items()))
            logger.error(
                "supervisor.worker_unresponsive %s: %s; it held %s", worker.name, why, held
            )
            self._unresponsive_count += 1
            self._unresponsive.append(
                {
                    "generation": worker.generation,
                    "worker": worker.index,
                    "pid": worker.pid,
                    "inFlight": dict(worker.in_flight),
                    "detail": why,
                }
            )
            self._on(m.WorkerUnresponsive(worker.generation, worker.index, why))
            return

    def status(self) -> dict[str, Any]:
        """``supervisor/v1/status``: a :class:`~forgezero_lifecycle.wire.supervisor.SupervisorStatus`."""
        from ..wire.supervisor import SupervisorStatus

        workers = []
        for number in self.machine.generations():
            generation = self._generations.get(number)
            if generation is None:
                continue
            states = self.machine.worker_states(number)
            retired = self.machine.retired(number)
            for index, state in enumerate(states):
                if state is m.WorkerState.EXITED or index >= len(generation.workers):
                    continue
                workers.append(
                    {
                        "generation": number,
                        "worker": index,
                        "pid": generation.workers[index].pid,
                        "state": state.value,
                        "retired": index in retired,
                    }
                )
        return SupervisorStatus(
            phase=self.machine.phase.value,
            generation=self.machine.current,
            size=self.machine.size,
            workers=workers,
            replaced=dict(self._replaced),
            given_up=self._given_up,
            replacing=self._replacing,
            unresponsive=list(self._unresponsive),
        ).model_dump(mode="json", by_alias=True)

    def exposition(self) -> str:
        """The supervisor's own counters, in the Prometheus text format."""
        name = "forgezero_supervisor_worker_replacements_total"
        lines = [
            f"# HELP {name} Workers replaced while their generation served on, by kind.",
            f"# TYPE {name} counter",
            *(
                f'{name}{{kind="{kind}"}} {self._replaced[kind]}'
                for kind in ("recycle", "unresponsive", "scale-up")
            ),
            "# HELP forgezero_supervisor_unresponsive_workers_total Workers whose event loop "
            "did not answer the heartbeat.",
            "# TYPE forgezero_supervisor_unresponsive_workers_total counter",
            f"forgezero_supervisor_unresponsive_workers_total {self._unresponsive_count}",
            "# HELP forgezero_supervisor_workers The workers a generation is to have.",
            "# TYPE forgezero_supervisor_workers gauge",
            f"forgezero_supervisor_workers {self.machine.size}",
        ]
        return "\n".join(lines) + "\n"

    def _worker_ready(self, worker: WorkerHandle) -> None:
        logger.info("supervisor.worker_ready %s", worker.name)
        self._on(m.WorkerReady(worker.generation, worker.index, worker.state_kind))

    def _worker_exited(self, worker: WorkerHandle) -> None:
        states = self.machine.worker_states(worker.generation)
        stopping = worker.index < len(states) and states[worker.index] is m.WorkerState.STOPPING
        stopping = stopping or worker.index in self.machine.retired(worker.generation)
        why = ""
        # A worker told to stop that exits 1 says its own stop failed (serve's exit status).
        failed = stopping and (worker.exit_code or 0) > 0
        if stopping:
            level = logging.WARNING if failed else logging.INFO
            logger.log(
                level, "supervisor.worker_exited %s reason=%s", worker.name, worker.exit_reason
            )
        elif not worker.ready.is_set():
            detail = f": {worker.detail}" if worker.detail else ""
            why = f"{worker.name} exited ({worker.exit_reason}) before it was ready{detail}"
            logger.error("supervisor.start_failed %s", why)
        else:
            logger.warning("supervisor.worker_lost %s reason=%s", worker.name, worker.exit_reason)
        self._on(m.WorkerExited(worker.generation, worker.index, why, failed=failed))

    def _drain_changed(self, number: int, change: Literal["begun", "rolled-back"]) -> None:
        if change == "rolled-back":
            self._on(m.DrainRolledBack(number))
            return
        self._on(m.DrainBegun(number))
        generation = self._generations[number]
        self._spawn(self._watch_drain(generation))

    async def _watch_drain(self, generation: Generation) -> None:
        await generation.acknowledged()
        state = await generation.controller.wait()
        logger.info("supervisor.drain_settled generation=%d state=%s", generation.number, state)
        self._on(m.DrainSettled(generation.number, state == "drained"))

    # Actions.

    async def _act(self, action: m.Action) -> None:
        self.handovers.step(action)  # an event of the running handover's span, if any
        match action:
            case m.StartGeneration(generation=number, workers=workers):
                self._start_generation(number, workers)
            case m.StartWorker(generation=number, index=index):
                await self._start_worker(self._generations[number], index)
            case m.ScheduleReplacement(generation=number, index=index, attempt=a, delay=delay):
                self._spawn(self._later(delay, m.ReplaceDue(number, index, a)))
            case m.Accept(generation=number, indexes=indexes, whole=whole):
                await self._accept(self._generations[number], indexes, whole=whole)
            case m.Prove(generation=number, indexes=indexes):
                self._spawn(self._prove(self._generations[number], indexes))
            case m.StopAccepting(generation=number):
                generation = self._generations[number]
                await asyncio.gather(*(w.command("stop_accepting") for w in generation.workers))
            case m.StartGrace(generation=number):
                grace = self._options.handover_grace
                self._spawn(self._later(grace, m.GraceOver(number)))
            case m.BeginDrain(generation=number, target=target):
                generation = self._generations[number]
                revision = None if target is None else self._generations[target].revision
                generation.begin_drain(self._options.drain_timeout, target=revision)
            case m.HandState(old=old, new=new, pairs=pairs):
                self._spawn(self._hand_state(self._generations[old], self._generations[new], pairs))
            case m.EmptyQueue():
                self._spawn(self._empty_the_queue())
            case m.StopWorkers(
                generation=number,
                indexes=indexes,
                force=force,
                short=short,
                timer=timer,
                hand_over=hand_over,
            ):
                generation = self._generations[number]
                if hand_over:
                    self._hand_over(generation, indexes, timer)
                else:
                    self._stop_workers(generation, indexes, force=force, short=short, timer=timer)
            case m.Kill(generation=number, indexes=indexes, unresponsive=unresponsive):
                self._kill(self._generations[number], indexes, unresponsive=unresponsive)
            case m.Forget(generation=number):
                forgotten = self._generations.pop(number, None)
                if forgotten is not None:
                    forgotten.close()
                    self._spawn(forgotten.aclose_preload())
            case m.HandoverBegun(number=handover, from_generation=old, to_generation=new):
                self._began_handover = time.monotonic()
                record = self.handovers.begin(old)
                record.to_generation = new
                self._records[handover] = record
                logger.info("supervisor.handover_begin from=%d to=%d", old, new)
            case m.HandoverEnded():
                self._end_handover(action)
            case m.Refused(why=why, what=what):
                logger.warning("supervisor.%s_refused: %s", what, why)
            case m.ReplacementBegun(generation=number, new=new, old=old, kind=kind, why=why):
                self._replacing_began(number, new, old, kind, why)
            case m.ReplacementEnded(
                generation=number, new=new, old=old, kind=kind, done=done, detail=detail
            ):
                self._replacing_ended(number, new, old, kind, done, detail)
            case m.Scaled(workers=workers, by=by):
                logger.info("supervisor.scaled workers=%d by=%+d", workers, by)
            case m.Exit(code=code, outcome=outcome):
                logger.info("supervisor.stopped drain=%s exit=%d", outcome, code)
                self._exit = code
                self._done.set()

    async def _later(self, delay: float, event: m.Event) -> None:
        await asyncio.sleep(delay)
        self._on(event)

    def _start_generation(self, number: int, workers: int) -> None:
        revision = self._first_revision
        if number > 1:
            try:
                revision = read_revision(self._options)
            except ConfigurationError as error:
                self._new_generation(number, None).prepare(workers)
                self._on(m.StartFailed(number, f"the revision could not be read: {error.detail}"))
                return
        generation = self._new_generation(number, revision)
        generation.prepare(workers)
        logger.info("supervisor.generation_starting generation=%d revision=%s", number, revision)
        for index in range(len(generation.workers)):
            self._spawn(self._start_worker(generation, index))

    def _new_generation(self, number: int, revision: str | None) -> Generation:
        # As many workers as the generation has now (scaling changes it between generations).
        options = dataclasses.replace(self._options, revision=revision, workers=self.machine.size)
        generation = Generation(
            number,
            app=self._app,
            options=options,
            listeners=[listener.sock for listener in self._listeners],
            on_ready=self._worker_ready,
            on_exit=self._worker_exited,
            on_drain=self._drain_changed,
            on_failure=self._handler_failed,
            on_limit=self._limit_reached,
        )
        forwarded = ForwardedControl(
            generation,
            on_reload=self.reload,
            on_scale=self.scale,
            status=self.status,
            exposition=self.exposition,
            handovers=self.handovers,
            serving=lambda: self.current,
            known=lambda: tuple(self._generations.values()),
        )
        generation.connect(forwarded.answer)
        self.handovers.trace_drains(generation)
        self._generations[number] = generation
        return generation

    async def _start_worker(self, generation: Generation, index: int) -> None:
        generation.place(index)
        if generation.workers[index].exited.is_set() and generation.workers[index].pid is None:
            return  # stopped before it was spawned (the stop came first): it never starts
        try:
            worker = await generation.start_worker(index)
        except OSError as error:
            logger.error(
                "supervisor.spawn_failed generation=%d worker=%d: %s",
                generation.number,
                index,
                error,
            )
            generation.workers[index].never_started()
            return
        self._spawn(worker.watch())
        self._spawn(self._start_timer(worker))

    async def _start_timer(self, worker: WorkerHandle) -> None:
        ready = asyncio.ensure_future(worker.ready.wait())
        gone = asyncio.ensure_future(worker.exited.wait())
        try:
            await asyncio.wait(
                (ready, gone),
                timeout=self._options.start_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            ready.cancel()
            gone.cancel()
        if not worker.ready.is_set() and not worker.exited.is_set():
            detail = f": {worker.detail}" if worker.detail else ""
            why = f"{worker.name} was not ready within {self._options.start_timeout:g} s{detail}"
            logger.error("supervisor.start_failed %s", why)
            self._on(m.StartTimeout(worker.generation, worker.index, why))

    async def _accept(
        self, generation: Generation, indexes: tuple[int, ...], *, whole: bool
    ) -> None:
        workers = [generation.workers[index] for index in indexes]
        if not whole:  # a replacement: into the generation's drain first, if one holds it
            await asyncio.gather(*(generation.join_drain(worker) for worker in workers))
        answers = await asyncio.gather(*(worker.command("accept") for worker in workers))
        for worker, answer in zip(workers, answers, strict=True):
            worker.accepting = answer.get("ok") is True
            if not worker.accepting:
                logger.error(
                    "supervisor.accept_refused %s code=%s", worker.name, answer.get("error")
                )
        if self._options.worker_timeout is not None:
            for worker in workers:
                self._spawn(self._heartbeat(worker))
        if not whole:
            for worker in workers:
                logger.info("supervisor.worker_replaced %s", worker.name)
            return
        generation.ready()
        if generation.number == 1:
            where = ", ".join(listener.describe() for listener in self._listeners)
            logger.info(
                "supervisor.serving generation=%d pids=%s on %s",
                generation.number,
                generation.pids,
                where,
            )
        else:  # ready once it proved it serves (:meth:`_prove`)
            logger.info(
                "supervisor.new_generation_accepting generation=%d pids=%s: it proves it serves",
                generation.number,
                generation.pids,
            )

    async def _prove(self, generation: Generation, indexes: tuple[int, ...]) -> None:
        """A handover's new generation accepts alongside the old one: prove that every worker
        of it serves (see the module docstring) within the start timeout; report the outcome."""
        bound = self._options.start_timeout
        began = time.monotonic()
        workers = [generation.workers[index] for index in indexes]
        proved: set[int] = set()
        gone: list[str] = []

        async def prove(worker: WorkerHandle) -> None:
            if not worker.accepting:
                gone.append(f"{worker.name} did not accept")
                raise _NotProvedError
            in_a_row = 0
            while in_a_row < PROOF_PROBES:
                if worker.exited.is_set():
                    gone.append(f"{worker.name} exited ({worker.exit_reason})")
                    raise _NotProvedError
                in_a_row = in_a_row + 1 if await worker.probe(PROBE_BOUND) else 0
                await asyncio.sleep(PROBE_INTERVAL)
            proved.add(worker.index)

        try:
            async with asyncio.timeout(bound), asyncio.TaskGroup() as group:
                for worker in workers:
                    group.create_task(prove(worker))
        except (TimeoutError, ExceptionGroup) as error:
            if isinstance(error, ExceptionGroup):
                _, rest = error.split(_NotProvedError)
                if rest is not None:
                    raise rest from None  # a failure of the supervisor's own code
            late = [w.name for w in workers if w.index not in proved and not w.exited.is_set()]
            what = "; ".join(gone) or (
                f"{', '.join(late)} did not answer through its server within {bound:g} s of "
                "the accept"
            )
            logger.error(
                "supervisor.proof_failed generation=%d: %s: %s", generation.number, NOT_PROVED, what
            )
            self._on(m.ProofSettled(generation.number, proved=False, why=what))
            return
        logger.info(
            "supervisor.new_generation_ready generation=%d pids=%s proved_in=%.2fs",
            generation.number,
            generation.pids,
            time.monotonic() - began,
        )
        self._on(m.ProofSettled(generation.number, proved=True))

    async def _hand_state(
        self, old: Generation, new: Generation, pairs: tuple[tuple[int, int], ...]
    ) -> None:
        try:
            await hand_state_over(old, new, self._options, pairs)
        finally:
            self._on(m.StateHanded(new.number))

    async def _empty_the_queue(self) -> None:
        """New connections are refused at the socket; the workers accept what is queued."""
        try:
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
        finally:
            self._on(m.QueueEmptied())

    def _stop_workers(
        self,
        generation: Generation,
        indexes: tuple[int, ...],
        *,
        force: bool,
        short: bool,
        timer: int,
    ) -> None:
        workers = [generation.workers[index] for index in indexes]
        for worker in workers:
            if worker.process is None:
                worker.never_started()
            else:
                self._spawn(worker.command("stop", force=force))
        bound = FORCED_STOP_BOUND if force else UNREADY_STOP_BOUND if short else self._stop_bound
        self._spawn(self._later(bound, m.StopTimeout(generation.number, timer)))

    def _kill(
        self, generation: Generation, indexes: tuple[int, ...], *, unresponsive: bool = False
    ) -> None:
        for index in indexes:
            worker = generation.workers[index]
            worker.retiring = worker.retiring or unresponsive
            why = "unresponsive" if unresponsive else "not stopped in time"
            if not unresponsive and worker.report == "booting":
                why += ", still booting (importing its app or running its lifespan startup)"
            if not worker.exited.is_set():
                logger.error("supervisor.worker_killed %s: %s", worker.name, why)
                worker.signal(signal.SIGKILL)

    def _hand_over(self, generation: Generation, indexes: tuple[int, ...], timer: int) -> None:
        """These workers leave a generation that serves on: each stops accepting, asks its
        keep-alive clients to reconnect (to its siblings) for the handover grace and until its
        HTTP connections are closed, then drains (``retire``); killed if still running after
        that bound."""
        for index in indexes:
            worker = generation.workers[index]
            worker.retiring = True
            logger.info("supervisor.worker_retiring %s: it hands its clients over", worker.name)
            self._spawn(self._retire(worker))
        # The grace, the wait for its connections to close (bounded by the drain's deadline),
        # then its drain and stop.
        bound = self._options.handover_grace + self._options.drain_timeout + self._stop_bound
        self._spawn(self._later(bound, m.StopTimeout(generation.number, timer)))

    async def _retire(self, worker: WorkerHandle) -> None:
        await worker.command("retire", grace=self._options.handover_grace)

    def _replacing_began(self, number: int, new: int, old: int | None, kind: str, why: str) -> None:
        generation = self._generations[number]
        if old is None:
            self._replacing = f"worker {new} of generation {number} is added ({why})"
            logger.info("supervisor.worker_adding generation=%d worker=%d: %s", number, new, why)
        else:
            replaced = generation.workers[old]
            self._replacing = f"{replaced.name} is replaced by worker {new} ({kind}: {why})"
            logger.info(
                "supervisor.worker_replacing %s by worker %d kind=%s: %s",
                replaced.name,
                new,
                kind,
                why,
            )

    def _replacing_ended(
        self, number: int, new: int, old: int | None, kind: str, done: bool, detail: str
    ) -> None:
        self._replacing = None
        generation = self._generations.get(number)
        workers = [] if generation is None else generation.workers

        def pid(index: int | None) -> int | None:
            return workers[index].pid if index is not None and index < len(workers) else None

        if done:
            self._replaced[kind] += 1
            logger.info(
                "supervisor.replacement_done generation=%d kind=%s old=%s (pid %s) new=%d (pid %s)",
                number,
                kind,
                old,
                pid(old),
                new,
                pid(new),
            )
        else:
            self._given_up += 1
            logger.warning(
                "supervisor.replacement_given_up generation=%d kind=%s old=%s (pid %s) new=%d: %s",
                number,
                kind,
                old,
                pid(old),
                new,
                detail,
            )

    def _end_handover(self, ended: m.HandoverEnded) -> None:
        record = self._records.pop(ended.number)
        seconds = time.monotonic() - self._began_handover
        detail = ended.detail
        if ended.by_stop:  # the stop takes over every generation: nothing keeps serving
            record.end("aborted", f"the supervisor stopped: {detail}", ended.failure)
            logger.info("supervisor.handover_stopped handover=%d: %s", ended.number, detail)
            return
        record.end("done" if ended.done else "aborted", detail, ended.failure)
        if ended.done:
            drained = ended.old_drained
            logger.info(
                "supervisor.handover_done from=%d to=%s old_drain=%s seconds=%.2f",
                record.from_generation,
                record.to_generation,
                "drained" if drained else "failed" if drained is False else "none",
                seconds,
            )
        else:
            logger.error(
                "supervisor.handover_aborted: %s; generation %d keeps serving",
                detail,
                record.from_generation,
            )


# The record of each handover, which ``supervisor/v1/handover`` answers from.


#: Handovers kept for ``supervisor/v1/handover``.
RECENT: Final = 16


@final
@dataclass
class Handover:
    """One handover, from generation ``from_generation``."""

    number: int
    from_generation: int
    to_generation: int | None = None
    state: HandoverState = "running"
    failure: HandoverFailure | None = None
    detail: str | None = None
    seconds: float | None = None
    _began: float = field(default_factory=time.monotonic, repr=False)
    #: Its ``forgezero.handover`` span while it runs (None without OpenTelemetry).
    span: Span | None = field(default=None, repr=False)

    def end(
        self,
        state: HandoverState,
        detail: str | None = None,
        failure: HandoverFailure | None = None,
    ) -> None:
        self.state = state
        self.failure = failure
        self.detail = detail
        self.seconds = round(time.monotonic() - self._began, 3)
        span, self.span = self.span, None
        if span is not None:
            from opentelemetry.trace import Status, StatusCode

            if self.to_generation is not None:
                span.set_attribute("forgezero.handover.to_generation", self.to_generation)
            span.set_attribute("forgezero.handover.state", state)
            if failure is not None:
                span.set_attribute("forgezero.handover.failure", failure)
            if state == "aborted":
                span.set_status(Status(StatusCode.ERROR, detail))
            span.end()

    def wire(self) -> dict[str, Any]:
        """The ``supervisor/v1/handover`` answer, a :class:`HandoverStatus`."""
        return HandoverStatus(
            handover=self.number,
            state=self.state,
            from_generation=self.from_generation,
            to_generation=self.to_generation,
            failure=self.failure,
            detail=self.detail,
            seconds=self.seconds,
        ).model_dump(mode="json")


@final
class HandoverLog:
    """The supervisor's recent handovers, newest last."""

    def __init__(self, *, tracer_provider: TracerProvider | None = None) -> None:
        self._recent: deque[Handover] = deque(maxlen=RECENT)
        self._begun = 0
        self._tracer_provider = tracer_provider
        self._otel = _otel()

    def begin(self, from_generation: int) -> Handover:
        self._begun += 1
        handover = Handover(self._begun, from_generation)
        if self._otel is not None:
            handover.span = self._otel.handover_span(
                handover.number, from_generation, self._tracer_provider
            )
        self._recent.append(handover)
        return handover

    def running_span(self) -> Span | None:
        """The span of the handover running now, or None."""
        latest = self._recent[-1] if self._recent else None
        return latest.span if latest is not None and latest.state == "running" else None

    def step(self, action: object) -> None:
        """Add the supervisor's ``action`` to the running handover's span as an event."""
        span = self.running_span()
        if span is not None and self._otel is not None:
            name, attributes = self._otel.step_event(action)
            span.add_event(name, attributes)

    def trace_drains(self, generation: Generation) -> None:
        """Every drain of ``generation`` as a span, the child of the handover that began it."""
        if self._otel is not None:
            self._otel.trace_drains(
                generation.controller,
                clock=SystemClock(),
                attributes={"forgezero.generation": generation.number},
                parent=self.running_span,
                in_flight=generation.in_flight,
                tracer_provider=self._tracer_provider,
            )

    def find(self, number: int | None = None) -> Handover | None:
        """Handover ``number``, or the latest when it is None; None when not (or no longer) kept."""
        if number is None:
            return self._recent[-1] if self._recent else None
        return next((h for h in self._recent if h.number == number), None)


def _otel() -> ModuleType | None:
    """:mod:`forgezero_lifecycle.otel` when OpenTelemetry's API is installed, else None."""
    try:
        from .. import otel
    except ImportError as error:
        if not (error.name or "").startswith("opentelemetry"):
            raise
        return None
    return otel


# The state, handed over worker by worker to the next generation.


async def hand_state_over(
    old: Generation,
    new: Generation,
    options: ServeOptions,
    pairs: tuple[tuple[int, int], ...] = (),
) -> None:
    """Each worker of ``old`` hands its state to its partner in ``new`` (``pairs`` of places, as
    the supervisor's machine decided; by default worker k to worker k)."""
    source = old.revision or UNKNOWN_REVISION
    target = new.revision or UNKNOWN_REVISION
    timeout_ms = deadline_ms(options.drain_timeout)

    async def one(before: WorkerHandle, after: WorkerHandle) -> None:
        assert before.state_kind is not None
        query = urlencode(
            {
                "sourceRevision": source,
                "targetRevision": target,
                # The new worker validates the value itself: the old one need not check it too.
                paths.IMPORT_CHECK_QUERY: paths.IMPORTER_CHECKS,
            }
        )
        request = {
            "protocol": before.state_kind["protocol"],
            "nonce": secrets.token_urlsafe(32),
            "schemaVersion": before.state_kind["schemaVersion"],
            "sourceRevision": source,
            "targetRevision": target,
            "source": {
                "url": f"http://127.0.0.1:{before.private_port}{paths.RUNTIME_STATE_EXPORT_PATH}?{query}",
                "authorization": f"Bearer {options.handoff_token}",
            },
        }
        answer = await after.command("import", request=request, timeoutMs=timeout_ms)
        status = answer.get("status", {})
        if status.get("status") == "acknowledged":
            logger.info(
                "supervisor.state_handed_over worker=%d cursor=%s",
                after.index,
                status.get("cursor"),
            )
        else:
            logger.error(
                "supervisor.state_handoff_failed worker=%d failure=%s",
                after.index,
                status.get("failure") or answer.get("error"),
            )

    if not pairs:
        pairs = tuple((index, index) for index in range(len(old.workers)))
    await asyncio.gather(*(one(old.workers[b], new.workers[a]) for b, a in pairs))


# The generation-wide control paths a worker forwards, answered here.


#: How long a generation's merged metrics scrape is reused (a scrape of 3,000 requests cost
#: the supervisor 6 s of CPU when each one asked every worker).
METRICS_REUSE: Final = 1.0


class _Worker(Protocol):
    """What the answers need of a worker (the supervisor's handle on it)."""

    @property
    def index(self) -> int: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def exited(self) -> asyncio.Event: ...
    def command(self, op: str, **fields: Any) -> Awaitable[dict[str, Any]]: ...


class _Generation(Protocol):
    """What the answers need of a generation."""

    @property
    def number(self) -> int: ...
    @property
    def controller(self) -> DrainController: ...
    @property
    def workers(self) -> Sequence[_Worker]: ...
    def detail(self) -> dict[str, Any]: ...
    def acknowledged(self) -> Awaitable[None]: ...


#: A call's answer before it goes on the channel: status, body (a JSON value), extra headers.
_Reply = tuple[int, object, list[tuple[str, str]]]


@final
class ForwardedControl:
    """One generation's answers, in the supervisor, to the calls its workers hand on."""

    def __init__(
        self,
        generation: _Generation,
        *,
        on_reload: Callable[[], int | str],
        on_scale: Callable[[int], int | str],
        status: Callable[[], dict[str, Any]],
        exposition: Callable[[], str],
        handovers: HandoverLog,
        serving: Callable[[], _Generation | None],
        known: Callable[[], Sequence[_Generation]],
        clock: Clock | None = None,
    ) -> None:
        """``serving``: the generation the supervisor hands the port to (a begin reaching
        another one is refused); ``known``: every generation it still knows (a drain's nonce
        is answered by whichever of them holds it); ``clock``: the metrics scrape's reuse."""
        self._generation = generation
        self._serving = serving
        self._known = known
        self._clock = clock or SystemClock()
        #: The last merged scrape (None: no worker serves metrics) and when it was begun.
        self._scraped: tuple[float, str | None] | None = None
        self._scraping = asyncio.Lock()  # one fan-out at a time; the others wait and reuse it
        self._on_reload = on_reload
        self._on_scale = on_scale
        self._status_of_supervisor = status
        self._exposition = exposition
        self._handovers = handovers
        self._calls: Mapping[str, Callable[[Mapping[str, object]], Awaitable[_Reply]]] = {
            "drain.begin": self._begin,
            "drain.status": self._status,
            "drain.current": self._current,
            "drain.rollback": self._rollback,
            "schedules": self._schedules,
            "metrics": self._metrics,
            "reload": self._reload,
            "handover": self._handover,
            "scale": self._scale,
            "status": self._supervisor,
        }

    async def answer(self, call: str, arguments: Mapping[str, object]) -> dict[str, Any]:
        """The channel answer (``{"status", "headers", "body"}``) to one call from a worker."""
        handler = self._calls.get(call)
        try:
            if handler is None:
                raise ControlPathNotFoundError(detail=f"no generation-wide call {call!r}")
            status, body, headers = await handler(arguments)
        except LifecycleError as error:
            refused = error_answer(error)
            status, body = refused.status, orjson.loads(refused.body)
            headers = list(refused.headers)
        return {
            "status": status,
            "headers": [["cache-control", "no-store"], *map(list, headers)],
            "body": body,
        }

    # The drain, for the whole generation.

    async def _begin(self, arguments: Mapping[str, object]) -> _Reply:
        serving = self._serving()
        if serving is not None and serving is not self._generation:
            # A request in flight on an old worker's connection when the handover switched:
            # a drain here would drain only what is retiring, and report it drained.
            raise DrainConflictError(
                "RUNTIME_DRAIN_GENERATION_RETIRING",
                detail=f"generation {self._generation.number} is retiring: a handover gave "
                f"the port to generation {serving.number}; send the begin again on a new "
                "connection",
            )
        accepted = self._generation.controller.begin(arguments.get("request"))
        await self._generation.acknowledged()
        return 202, accepted.model_dump(), []

    async def _status(self, arguments: Mapping[str, object]) -> _Reply:
        nonce = _nonce(arguments)
        generation = self._holding(nonce)
        await _refresh(generation)
        return _with_detail(generation, generation.controller.status(nonce))

    async def _current(self, arguments: Mapping[str, object]) -> _Reply:
        await _refresh(self._generation)
        return _with_detail(self._generation, self._generation.controller.current())

    async def _rollback(self, arguments: Mapping[str, object]) -> _Reply:
        nonce = _nonce(arguments)
        generation = self._holding(nonce)
        status = generation.controller.rollback(nonce)
        await generation.acknowledged()
        return _with_detail(generation, status)

    def _holding(self, nonce: str) -> _Generation:
        """The generation whose drain has ``nonce``: this one, or another the supervisor still
        knows (a drain of the old generation, polled through a new worker after the switch)."""
        for generation in (self._generation, *self._known()):
            try:
                generation.controller.status(nonce)
            except DrainNotFoundError:
                continue
            return generation
        return self._generation  # its controller answers the 404

    def _live(self) -> list[_Worker]:
        return _live(self._generation)

    # The rest of the generation-wide paths.

    async def _schedules(self, arguments: Mapping[str, object]) -> _Reply:
        workers = self._live()
        answers = await asyncio.gather(*(worker.command("schedules") for worker in workers))
        schedules = [
            {**entry, "worker": worker.index, "pid": worker.pid}
            for worker, answer in zip(workers, answers, strict=True)
            for entry in answer.get("schedules", [])
        ]
        return 200, {"schedules": schedules}, []

    async def _metrics(self, arguments: Mapping[str, object]) -> _Reply:
        """Every worker's scrape, labelled with its worker (opt-in, no token), at most
        :data:`METRICS_REUSE` seconds old."""
        async with self._scraping:
            if self._scraped is None or self._clock.monotonic() - self._scraped[0] >= METRICS_REUSE:
                begun = self._clock.monotonic()
                self._scraped = (begun, await self._scrape())
            text = self._scraped[1]
        if text is None:  # the app serves no metrics: the path is unknown, as in one process
            raise ControlPathNotFoundError(detail="no such control path")
        from prometheus_client import CONTENT_TYPE_LATEST

        return 200, "" if arguments.get("head") else text, [("content-type", CONTENT_TYPE_LATEST)]

    async def _scrape(self) -> str | None:
        workers = self._live()
        answers = await asyncio.gather(*(worker.command("metrics") for worker in workers))
        scraped = [
            ({"worker": str(worker.index), "pid": str(worker.pid)}, answer["text"].encode())
            for worker, answer in zip(workers, answers, strict=True)
            if isinstance(answer.get("text"), str)
        ]
        if not scraped:
            return None
        from ..metrics import merge_expositions

        return merge_expositions(scraped).decode() + self._exposition()

    async def _reload(self, arguments: Mapping[str, object]) -> _Reply:
        number = self._on_reload()
        if isinstance(number, str):
            raise ReloadBusyError(detail=f"{number}; try again once it is done")
        return 202, ReloadAccepted(handover=number).model_dump(mode="json"), []

    async def _scale(self, arguments: Mapping[str, object]) -> _Reply:
        by = arguments.get("by")
        if by not in (1, -1) or isinstance(by, bool) or not isinstance(by, int):
            raise DrainRequestInvalidError(detail='the body of a scale is {"by": 1} or {"by": -1}')
        workers = self._on_scale(by)
        if isinstance(workers, str):
            raise ScaleRefusedError(detail=workers)
        return 202, ScaleAccepted(workers=workers).model_dump(mode="json"), []

    async def _supervisor(self, arguments: Mapping[str, object]) -> _Reply:
        return 200, self._status_of_supervisor(), []

    async def _handover(self, arguments: Mapping[str, object]) -> _Reply:
        number = arguments.get("number")
        if number is not None and not isinstance(number, int):
            raise DrainRequestInvalidError(detail="a handover number is a whole number")
        handover = self._handovers.find(number)
        if handover is None:
            detail = (
                "no handover has begun"
                if number is None
                else "no handover with this number (give the number reload answered)"
            )
            raise ControlPathNotFoundError(detail=detail)
        return 200, handover.wire(), []


def _live(generation: _Generation) -> list[_Worker]:
    return [worker for worker in generation.workers if not worker.exited.is_set()]


async def _refresh(generation: _Generation) -> None:
    """Fresh counters from every worker of ``generation`` (each bounded by the command timeout)."""
    await asyncio.gather(*(worker.command("status") for worker in _live(generation)))


def _with_detail(generation: _Generation, status: Any) -> _Reply:
    document = status.model_dump(mode="json", exclude_none=True)
    document["detail"] = generation.detail()
    return 200, document, []


def _nonce(arguments: Mapping[str, object]) -> str:
    nonce = arguments.get("nonce")
    if not isinstance(nonce, str):
        raise DrainNotFoundError(detail="the nonce query parameter is required")
    return nonce
