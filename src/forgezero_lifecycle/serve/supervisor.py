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

State (when the app has a state adapter): worker k of g hands its state to worker k of g+1 once
g is drained (:mod:`.state_transfer`); a handover whose state cannot be handed over is refused
before g is touched.

* **One worker at a time** (recycling, the watchdog, scaling), as a handover of one worker: a
  worker past ``--max-requests`` (with its jitter), ``--max-worker-memory`` or
  ``--max-worker-lifetime`` reports it (:mod:`.recycling`); a worker whose event loop does not
  answer the heartbeat (``--worker-timeout``) is noticed here; SIGTTIN, SIGTTOU and
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
import signal
import time
from collections import Counter, deque
from collections.abc import Coroutine, Sequence
from typing import Any, Final, Literal, final

from .._errors import ConfigurationError
from ..stop.sockets import accept_queue_length, refuse_new_connections
from . import machine as m
from .forwarding import ForwardedControl
from .handovers import Handover, HandoverLog
from .listeners import Listener, held_listeners
from .options import ServeOptions, read_revision
from .server import SHUTDOWN_MARGIN, log_config
from .state_transfer import hand_state_over
from .uvicorn_options import configure_logging
from .workers import Generation, WorkerHandle

__all__ = ["Supervisor", "SupervisorFailedError", "run_supervisor"]

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
            for generation in self._generations.values():
                generation.close()
        if self._failure is not None:
            raise self._failure
        return self._exit

    async def _stop_leftovers(self) -> None:
        """Only after a failure of the supervisor's own code: nothing may outlive it. Every
        worker still running is told to stop now, and killed :data:`FORCED_STOP_BOUND` later."""
        running = [
            worker
            for generation in self._generations.values()
            for worker in generation.workers
            if worker.process is not None and worker.process.returncode is None
        ]
        processes = [worker.process for worker in running if worker.process is not None]
        for worker in running:
            logger.error("supervisor.worker_stopped %s: the supervisor ends", worker.name)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FORCED_STOP_BOUND):
                await asyncio.gather(*(worker.command("stop", force=True) for worker in running))
                await asyncio.gather(*(process.wait() for process in processes))
        for worker in running:
            if worker.process is not None and worker.process.returncode is None:
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
