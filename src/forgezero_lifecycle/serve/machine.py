"""The supervisor's decisions, without I/O: events in, actions out (``serve --workers N``).

:class:`SupervisorMachine` owns every state the supervisor decides on: its own :class:`Phase`
(and, while handing over, the :class:`Step`), each generation's :class:`GenerationState` and
each worker's :class:`WorkerState`. They change only in its methods, and only as the table below
says. The I/O layer (:mod:`.supervisor` with :mod:`.generation` and :mod:`.worker_handle`: processes,
sockets, signals, the channel) turns what happens into an event, hands it to
:meth:`SupervisorMachine.handle`, and carries out the actions it gets back, in order.

Phases (``g`` is the current generation, ``n`` the one a handover starts)::

    starting ──all of g ready──▶ serving ──reload──▶ handing over ──n serves, g stopped──▶ serving
       │                           │                    │ (aborted: n stopped, g untouched)
       └──stop signal──────────────┴──stop signal───────┴──────────▶ stopping ──▶ stopped

A handover's steps: ``starting`` (n's workers start and import the app, each within the start
timeout) → ``proving`` (every worker of n is ready and can take g's state: n accepts, then g
stops accepting; the handover grace lets g's keep-alive clients move over) → ``draining`` (g
drains under its deadline) → ``handing-state`` (only when the app has a state adapter: worker k
of g to worker k of n) → ``stopping-old`` (g's workers stop) → serving.

A generation: ``starting`` → ``serving`` (its workers accept on the shared listener; never before
all of them are ready) → ``retiring`` (a handover told it to stop accepting) → ``draining`` →
``drained`` | ``failed`` → ``stopping`` → ``stopped`` (then forgotten). A worker: ``starting`` →
``ready`` → ``accepting`` → ``stopping`` → ``exited`` (any state may go to ``exited``).

Every (phase, event) pair is one entry of :data:`.table.TABLE`: a transition (the handler
below decides), *stale* (ignored on purpose, for the reason given) or *impossible* (raises
:class:`~.table.ImpossibleEventError`). A timer belongs to the step that set it: a stop timer
kills only the workers that very stop still waits for. An action that begins something
(:data:`BEGINNINGS`) decided before a stop is never carried out after it (:meth:`outdated`).

Every (phase, event) pair (rendered from :data:`.table.TABLE`)::

    Reload (reload (SIGHUP or request)):
      starting: refused: the first generation is still starting
      serving: refused while an orchestrator's drain holds g (until its rollback); else start
          generation n, the handover's step is starting
      handing-over: refused: one handover at a time
      stopping: refused: the supervisor is stopping
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    StopSignal (stop signal (SIGTERM, SIGINT)):
      starting: stop every worker (none accepted yet) under the short bound; exit 1 once gone
      serving: drain g under the stop's deadline; a replacement still starting stops (short
          bound)
      handing-over: the handover ends. n not accepting yet: stop n (short bound), drain g; after
          the switch: drain g and n, both begun now under one deadline
      stopping: the second signal forces: stop every worker now, kill after the forced bound,
          exit 1
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    WorkerReady (worker ready):
      starting: all of g ready: g accepts, serving
      serving: a replacement: it accepts (joining its generation's drain first, if one holds it)
      handing-over: n all ready: the state refused → abort (n stops, g untouched), else n
          accepts, g stops accepting, the grace starts; a replacement of the accepting
          generation accepts
      stopping: *stale*: every worker not ready when the stop began was told to stop then: its
          ready is late
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    WorkerExited (worker exited):
      starting: the start failed: stop the rest, exit 1 once gone
      serving: its generation serving, or held by an orchestrator's drain: replace it after a
          backoff; else recorded
      handing-over: a worker of n before the switch: abort (n stops, g untouched); of the
          generation that serves (or is held by an orchestrator's drain): replace it after a
          backoff; the last of g in stopping-old: done
      stopping: recorded; every worker gone and the drains settled: exit
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    StartTimeout (start timeout):
      starting: as worker exited: the start failed
      serving: a replacement: stop it (short bound); replaced again once it exited
      handing-over: a worker of n: abort; a replacement: stop it (short bound)
      stopping: *stale*: every worker still starting was told to stop when the stop began, under
          its own timer
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    StartFailed (start failed (revision unreadable)):
      starting: *impossible* (raises): the first generation's revision is read before the start
      serving: *impossible* (raises): a revision is read only as a handover's generation starts,
          and the handover runs until that generation reported
      handing-over: n could not start: abort, g untouched
      stopping: *impossible* (raises): a generation's start decided before the stop is never
          carried out after it
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    ReplaceDue (replace due):
      starting: *impossible* (raises): a replacement is scheduled only in an accepting
          generation
      serving: its generation still the one that serves: start the worker again
      handing-over: its generation still the one that serves: start the worker again
      stopping: *stale*: no worker starts into a stop: the replacement is dropped
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    GraceOver (grace over):
      starting: *impossible* (raises): a grace starts only at a handover's switch
      serving: *impossible* (raises): a handover ends only after its grace is over
      handing-over: proving: drain g (or follow an orchestrator's drain of g; a g with no worker
          left stops at once: done)
      stopping: *stale*: the grace of the handover the stop ended
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    DrainBegun (drain begun):
      starting: *stale*: the first generation has not accepted: it holds no admitted work, and a
          drain begun through a worker's private port changes only what the workers answer
      serving: g draining (an orchestrator's drain): a worker lost meanwhile is replaced and
          joins it
      handing-over: recorded: the generation drains; the handover follows it
      stopping: recorded: the stop waits for it too
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    DrainRolledBack (drain rolled back):
      starting: *stale*: the first generation has not accepted: it holds no admitted work, and a
          drain begun through a worker's private port changes only what the workers answer
      serving: g serving again
      handing-over: g after the switch: retiring again (in step draining its drain begins anew);
          before the switch, or n: serving again
      stopping: its intake opened again: the stop drains it again (a generation already
          stopping: its outcome is unknown, recorded failed)
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    DrainSettled (drain settled):
      starting: *stale*: the first generation has not accepted: it holds no admitted work, and a
          drain begun through a worker's private port changes only what the workers answer
      serving: recorded (an orchestrator's drain)
      handing-over: g in step draining: hand the state over, or stop g (full bound; no worker
          left: done); else recorded
      stopping: the last of the stop's drains: empty the accept queue (forced: exit)
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    StateHanded (state handed):
      starting: *impossible* (raises): a state transfer runs only in a handover
      serving: *impossible* (raises): a handover ends only after its state transfer
      handing-over: handing-state: stop g (full bound; no worker left: done)
      stopping: *stale*: the transfer of the handover the stop ended
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    QueueEmptied (queue emptied):
      starting: *impossible* (raises): the accept queue is emptied only by a stop
      serving: *impossible* (raises): the accept queue is emptied only by a stop
      handing-over: *impossible* (raises): the accept queue is emptied only by a stop
      stopping: stop every worker left (full bound)
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    StopTimeout (stop timeout):
      starting: *impossible* (raises): no worker is stopped before the first generation serves
          (a failed start is a stop)
      serving: kill the workers that stop left, if any is still running
      handing-over: kill the workers that stop left, if any is still running
      stopping: kill the workers that stop left, if any is still running
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks

The invariants (checked after every step by ``tests/serve/test_supervisor_machine.py``): a worker
whose generation accepted is killed only when the stop was forced or its generation's drain has
settled; a stop drains every generation that holds admitted work, all begun in the same step; no
worker is started into a generation that stopped accepting; exit 0 only when every generation
that accepted drained; at most one generation accepts between steps (two only inside the
handover's switch: n accepts before g stops); an aborted handover never touches g.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, final

from .table import TABLE, Impossible, ImpossibleEventError, Phase, Stale

__all__ = [
    "BEGINNINGS",
    "REPLACE_BACKOFF",
    "Accept",
    "Action",
    "BeginDrain",
    "DrainBegun",
    "DrainRolledBack",
    "DrainSettled",
    "EmptyQueue",
    "Event",
    "Exit",
    "Forget",
    "GenerationState",
    "GraceOver",
    "HandState",
    "HandoverBegun",
    "HandoverEnded",
    "ImpossibleEventError",
    "Kill",
    "Phase",
    "QueueEmptied",
    "Refused",
    "Reload",
    "ReplaceDue",
    "ScheduleReplacement",
    "StartFailed",
    "StartGeneration",
    "StartGrace",
    "StartTimeout",
    "StartWorker",
    "StateHanded",
    "Step",
    "StopAccepting",
    "StopSignal",
    "StopTimeout",
    "StopWorkers",
    "SupervisorMachine",
    "WorkerExited",
    "WorkerReady",
    "WorkerState",
    "state_refusal",
]

#: Pauses before each attempt to replace a worker that died while its generation served.
REPLACE_BACKOFF: Final = (0.0, 0.5, 1.0, 2.0, 5.0, 10.0)


class Step(enum.StrEnum):
    """Where a handover is (only while the phase is ``handing-over``)."""

    STARTING = "starting"
    PROVING = "proving"
    DRAINING = "draining"
    HANDING_STATE = "handing-state"
    STOPPING_OLD = "stopping-old"


class GenerationState(enum.StrEnum):
    STARTING = "starting"
    SERVING = "serving"
    RETIRING = "retiring"
    DRAINING = "draining"
    DRAINED = "drained"
    FAILED = "failed"
    STOPPING = "stopping"
    STOPPED = "stopped"


class WorkerState(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"
    ACCEPTING = "accepting"
    STOPPING = "stopping"
    EXITED = "exited"


# Events: what happened (the I/O layer reports them).


@dataclass(frozen=True, slots=True)
class Reload:
    """SIGHUP (``request=False``) or ``POST supervisor/v1/reload``."""

    request: bool = False


@dataclass(frozen=True, slots=True)
class StopSignal:
    """SIGTERM or SIGINT (the second one forces)."""

    name: str = "SIGTERM"


@dataclass(frozen=True, slots=True)
class WorkerReady:
    generation: int
    index: int
    #: The protocol and schema version of the worker's state adapter (None without one).
    state_kind: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class WorkerExited:
    generation: int
    index: int
    #: What the I/O layer knows of the exit (the exit code, the worker's last words).
    why: str = ""


@dataclass(frozen=True, slots=True)
class StartTimeout:
    """The worker was not ready within the start timeout."""

    generation: int
    index: int
    why: str = ""


@dataclass(frozen=True, slots=True)
class StartFailed:
    """The generation could not be started at all (its revision could not be read)."""

    generation: int
    why: str


@dataclass(frozen=True, slots=True)
class ReplaceDue:
    """The pause before attempt ``attempt`` to replace worker ``index`` is over."""

    generation: int
    index: int
    attempt: int


@dataclass(frozen=True, slots=True)
class GraceOver:
    generation: int


@dataclass(frozen=True, slots=True)
class DrainBegun:
    """A drain of the generation began (the supervisor's own, or an orchestrator's)."""

    generation: int


@dataclass(frozen=True, slots=True)
class DrainRolledBack:
    generation: int


@dataclass(frozen=True, slots=True)
class DrainSettled:
    generation: int
    drained: bool


@dataclass(frozen=True, slots=True)
class StateHanded:
    generation: int


@dataclass(frozen=True, slots=True)
class QueueEmptied:
    pass


@dataclass(frozen=True, slots=True)
class StopTimeout:
    """The bound given with the :class:`StopWorkers` that set ``timer`` is over."""

    generation: int
    timer: int


Event = (
    Reload
    | StopSignal
    | WorkerReady
    | WorkerExited
    | StartTimeout
    | StartFailed
    | ReplaceDue
    | GraceOver
    | DrainBegun
    | DrainRolledBack
    | DrainSettled
    | StateHanded
    | QueueEmptied
    | StopTimeout
)

# Actions: what the I/O layer must do, in the order given.


@dataclass(frozen=True, slots=True)
class StartGeneration:
    """Read the revision (not for the first) and start every worker, each with a start timer."""

    generation: int


@dataclass(frozen=True, slots=True)
class StartWorker:
    """Start a replacement for worker ``index`` (with a start timer)."""

    generation: int
    index: int


@dataclass(frozen=True, slots=True)
class ScheduleReplacement:
    """Report :class:`ReplaceDue` after ``delay`` seconds."""

    generation: int
    index: int
    attempt: int
    delay: float


@dataclass(frozen=True, slots=True)
class Accept:
    """These ready workers accept on the shared listener (await their acknowledgement)."""

    generation: int
    indexes: tuple[int, ...]
    #: The whole generation begins to accept (else: replacements join it).
    whole: bool = False


@dataclass(frozen=True, slots=True)
class StopAccepting:
    """The generation's workers stop accepting and close their idle keep-alive connections."""

    generation: int


@dataclass(frozen=True, slots=True)
class StartGrace:
    """Report :class:`GraceOver` after the handover grace."""

    generation: int


@dataclass(frozen=True, slots=True)
class BeginDrain:
    """Drain the generation (or follow the drain begun); report :class:`DrainSettled`. Every
    BeginDrain of one step shares one deadline."""

    generation: int
    #: The generation that will serve instead (a handover), for ``targetRevision``.
    target: int | None = None


@dataclass(frozen=True, slots=True)
class HandState:
    """Worker k of ``old`` hands its state to worker k of ``new``; report :class:`StateHanded`."""

    old: int
    new: int


@dataclass(frozen=True, slots=True)
class EmptyQueue:
    """Refuse new connections at the socket, wait (bounded) until the queue is accepted;
    report :class:`QueueEmptied`."""


@dataclass(frozen=True, slots=True)
class StopWorkers:
    """Ask these workers to stop (``force``: at once); report :class:`StopTimeout` with
    ``timer`` after the bound (``short``: the bound of workers that never accepted, else the
    stop's)."""

    generation: int
    indexes: tuple[int, ...]
    force: bool = False
    short: bool = False
    #: This stop's timer: its timeout kills only the workers this stop still waits for.
    timer: int = 0


@dataclass(frozen=True, slots=True)
class Kill:
    """SIGKILL these workers."""

    generation: int
    indexes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Forget:
    """The generation is gone (every worker exited): drop what the I/O layer holds of it."""

    generation: int


@dataclass(frozen=True, slots=True)
class HandoverBegun:
    number: int
    from_generation: int
    to_generation: int


@dataclass(frozen=True, slots=True)
class HandoverEnded:
    number: int
    done: bool
    detail: str | None = None
    #: How g's drain settled (a handover that is done): True drained, False failed.
    old_drained: bool | None = None
    #: Ended by the stop (``detail`` says what the stop does with each generation), not
    #: aborted with g serving on.
    by_stop: bool = False


@dataclass(frozen=True, slots=True)
class Refused:
    """A reload that cannot begin now (logged; the request answers 409)."""

    why: str


@dataclass(frozen=True, slots=True)
class Exit:
    code: int
    #: What the stop reports: ``drained``, ``failed``, ``forced`` or ``not-started``.
    outcome: str


Action = (
    StartGeneration
    | StartWorker
    | ScheduleReplacement
    | Accept
    | StopAccepting
    | StartGrace
    | BeginDrain
    | HandState
    | EmptyQueue
    | StopWorkers
    | Kill
    | Forget
    | HandoverBegun
    | HandoverEnded
    | Refused
    | Exit
)


#: Actions that begin something: decided before a stop, they are dropped, never carried out
#: after it (the I/O layer reports a dropped start as a worker that never started).
BEGINNINGS: Final = (StartGeneration, StartWorker, HandState)


def state_refusal(
    old: Sequence[dict[str, Any] | None], new: Sequence[dict[str, Any] | None], *, token: bool
) -> str | None:
    """Why worker k's state (kinds ``old``) cannot be handed to the new worker k (None: it can)."""
    if all(kind is None for kind in old):
        return None
    if not token:
        return "the app has a state adapter and no handoff token is set (FORGEZERO_HANDOFF_TOKEN)"
    for index, (before, after) in enumerate(zip(old, new, strict=True)):
        if before != after:
            return (
                f"worker {index}'s state {before} cannot be imported by the new worker {index} "
                f"({after})"
            )
    return None


#: The states of a generation whose lost workers are replaced (when it is the current one).
_REPLACEABLE: Final = (
    GenerationState.SERVING,
    GenerationState.DRAINING,
    GenerationState.DRAINED,
    GenerationState.FAILED,
)


@final
@dataclass
class _Generation:
    number: int
    workers: list[WorkerState]
    state: GenerationState = GenerationState.STARTING
    kinds: list[dict[str, Any] | None] = field(default_factory=list)
    #: Its workers accepted once: it may hold admitted work until its drain settles.
    accepted: bool = False
    #: The last drain's outcome (None: none settled since the last begin).
    drained: bool | None = None
    attempts: dict[int, int] = field(default_factory=dict)
    #: Each stopping worker's timer: the stop that set it (0: none).
    timers: list[int] = field(default_factory=list)

    def live(self) -> tuple[int, ...]:
        return tuple(i for i, w in enumerate(self.workers) if w is not WorkerState.EXITED)


@final
class SupervisorMachine:
    """The supervisor's states and the table of its decisions (see the module docstring)."""

    def __init__(self, workers: int, *, state_token: bool = False) -> None:
        self._size = workers
        self._state_token = state_token
        self.phase = Phase.STARTING
        self.step: Step | None = None
        #: The generation that serves (during a handover: g until n accepts, then n).
        self.current: int | None = None
        #: A running handover's generations: g, and n (the one it starts).
        self.old: int | None = None
        self.new: int | None = None
        self._generations: dict[int, _Generation] = {}
        self._number = 0
        self._handovers = 0
        self._handover: int | None = None
        #: Aborted handovers, by the generation they started: reported ended once it stopped.
        self._aborted: dict[int, tuple[int, str]] = {}
        self.forced = False
        #: The generations the stop waits for: each that accepted, with its drain's outcome.
        self._stop_drains: set[int] = set()
        self._outcomes: dict[int, bool] = {}
        self._queue_emptied = False
        self.exit_code: int | None = None
        self._timers = 0
        #: How many stops began (0 or 1; 2 once forced): the actions decided before are stale.
        self.stops = 0

    # What the I/O layer and the tests may read.

    def generations(self) -> list[int]:
        """The generations still known (a stopped one is forgotten)."""
        return sorted(self._generations)

    def generation_state(self, number: int) -> GenerationState:
        found = self._generations.get(number)
        return GenerationState.STOPPED if found is None else found.state

    def worker_states(self, number: int) -> tuple[WorkerState, ...]:
        found = self._generations.get(number)
        return () if found is None else tuple(found.workers)

    def accepted(self, number: int) -> bool:
        found = self._generations.get(number)
        return found is not None and found.accepted

    def drain_outcome(self, number: int) -> bool | None:
        found = self._generations.get(number)
        return None if found is None else found.drained

    def outdated(self, action: Action, stops: int) -> bool:
        """``action``, decided when :attr:`stops` was ``stops``, must not be carried out now."""
        return stops < self.stops and isinstance(action, BEGINNINGS)

    @property
    def handover(self) -> int | None:
        """The number of the running handover."""
        return self._handover

    # The start.

    def start(self) -> list[Action]:
        """The first generation (call once, before any event)."""
        assert self._number == 0
        self.current = self._new_generation()
        return [StartGeneration(self.current)]

    def _new_generation(self) -> int:
        self._number += 1
        workers = [WorkerState.STARTING] * self._size
        self._generations[self._number] = _Generation(
            self._number, workers, kinds=[None] * self._size, timers=[0] * self._size
        )
        return self._number

    # Events.

    def handle(self, event: Event) -> list[Action]:
        """The actions ``event`` calls for, in order; the states change as the table says."""
        rule = TABLE[(self.phase, type(event).__name__)]
        if isinstance(rule, Stale):
            return []
        if isinstance(rule, Impossible):
            raise ImpossibleEventError(f"{event} in phase {self.phase}: {rule.why}")
        actions = self._decide(event)
        return actions + self._forget()

    def _forget(self) -> list[Action]:
        """Forget each generation whose workers are all gone, unless it serves, takes part in
        the handover or has a drain to settle (the supervisor keeps no history of them)."""
        keep = {self.current, self.old, self.new}
        actions: list[Action] = []
        for number, generation in list(self._generations.items()):
            gone = number not in keep and not generation.live()
            if gone and generation.state is not GenerationState.DRAINING:
                del self._generations[number]
                actions.append(Forget(number))
        return actions

    def _decide(self, event: Event) -> list[Action]:
        match event:
            case Reload():
                return self._reload()
            case StopSignal():
                return self._stop_signal()
            case WorkerReady(generation=number, index=index, state_kind=kind):
                return self._worker_ready(number, index, kind)
            case WorkerExited(generation=number, index=index, why=why):
                return self._worker_exited(number, index, why)
            case StartTimeout(generation=number, index=index, why=why):
                return self._start_timeout(number, index, why)
            case StartFailed(generation=number, why=why):
                return self._start_failed(number, why)
            case ReplaceDue(generation=number, index=index, attempt=attempt):
                return self._replace_due(number, index, attempt)
            case GraceOver(generation=number):
                return self._grace_over(number)
            case DrainBegun(generation=number):
                return self._drain_begun(number)
            case DrainRolledBack(generation=number):
                return self._drain_rolled_back(number)
            case DrainSettled(generation=number, drained=drained):
                return self._drain_settled(number, drained)
            case StateHanded(generation=number):
                return self._state_handed(number)
            case QueueEmptied():
                return self._queue_empty()
            case StopTimeout(generation=number, timer=timer):
                return self._stop_timeout(number, timer)

    def _reload(self) -> list[Action]:
        if self.phase is Phase.STARTING:
            return [Refused("the first generation is still starting")]
        if self.phase is Phase.STOPPING:
            return [Refused("the supervisor is stopping")]
        if self.phase is Phase.HANDING_OVER:
            return [Refused("a handover is running")]
        assert self.current is not None
        if self._generations[self.current].state is not GenerationState.SERVING:
            # An orchestrator's drain holds it: a new generation would lose that drain.
            return [Refused(f"a drain holds generation {self.current}: roll it back first")]
        self.old, self.new = self.current, self._new_generation()
        self._handovers += 1
        self._handover = self._handovers
        self.phase, self.step = Phase.HANDING_OVER, Step.STARTING
        return [HandoverBegun(self._handover, self.old, self.new), StartGeneration(self.new)]

    def _stop_signal(self) -> list[Action]:
        self.stops += 1
        if self.phase is Phase.STOPPING:
            return self._force()
        actions: list[Action] = []
        if self.phase is Phase.STARTING:
            self.phase = Phase.STOPPING
            self._queue_emptied = True  # nothing accepted: nothing queued is anyone's yet
            assert self.current is not None
            actions += self._stop_generation(self.current, short=True)
            return actions + self._maybe_exit()
        if self.phase is Phase.HANDING_OVER:
            assert self._handover is not None
            assert self.new is not None
            unserved = ""
            if not self._generations[self.new].accepted:  # n holds nothing: g serves alone
                actions += self._stop_generation(self.new, short=True)
                unserved = f"generation {self.new} never served and is stopped; "
            drained = [str(n) for n, g in sorted(self._generations.items()) if g.accepted]
            plural = "s" if len(drained) > 1 else ""
            what = f"{unserved}the stop drains generation{plural} {', '.join(drained)}"
            actions.append(HandoverEnded(self._handover, False, what, by_stop=True))
            self._handover, self.old, self.new, self.step = None, None, None, None
        self.phase = Phase.STOPPING
        for number, generation in sorted(self._generations.items()):
            if not generation.accepted:
                continue
            # A replacement not ready yet holds no admitted work: it stops now, on its own timer.
            starting = tuple(
                i for i, w in enumerate(generation.workers) if w is WorkerState.STARTING
            )
            if starting:
                actions.append(self._stop(generation, starting, short=True))
            self._stop_drains.add(number)
            if generation.state in (GenerationState.SERVING, GenerationState.RETIRING):
                generation.state = GenerationState.DRAINING
                generation.drained = None
                actions.append(BeginDrain(number))
            elif generation.state is not GenerationState.DRAINING:
                self._outcomes[number] = bool(generation.drained)
        return actions + self._after_drains()

    def _force(self) -> list[Action]:
        self.forced = True
        actions: list[Action] = []
        for generation in [g for _, g in sorted(self._generations.items())]:
            live = generation.live()
            if live:
                generation.state = GenerationState.STOPPING
                actions.append(self._stop(generation, live, short=True, force=True))
        self._queue_emptied = True
        return actions + self._maybe_exit()

    def _worker_ready(self, number: int, index: int, kind: dict[str, Any] | None) -> list[Action]:
        generation = self._generations.get(number)
        if generation is None or generation.workers[index] is not WorkerState.STARTING:
            return []
        generation.workers[index] = WorkerState.READY
        generation.kinds[index] = kind
        if generation.state is GenerationState.STARTING:
            if any(w is not WorkerState.READY for w in generation.workers):
                return []
            if self.phase is Phase.STARTING and number == self.current:
                self.phase = Phase.SERVING
                return self._accept(generation, generation.live())
            if self.phase is Phase.HANDING_OVER and number == self.new:
                return self._switch()
            return []
        if self._replaces(generation):
            generation.attempts.pop(index, None)
            return self._accept(generation, (index,))
        # A replacement whose generation stopped accepting meanwhile: it stops again.
        return [self._stop(generation, (index,), short=True)]

    def _accept(self, generation: _Generation, indexes: tuple[int, ...]) -> list[Action]:
        """The workers accept; the whole of a starting generation serves (a replacement in a
        draining generation joins its drain: the I/O layer begins it there first)."""
        whole = generation.state is GenerationState.STARTING
        if whole:
            generation.state = GenerationState.SERVING
        generation.accepted = True
        for index in indexes:
            generation.workers[index] = WorkerState.ACCEPTING
        return [Accept(generation.number, indexes, whole=whole)]

    def _switch(self) -> list[Action]:
        """Every worker of n is ready: n accepts, g stops accepting (or the handover aborts)."""
        assert self.old is not None
        assert self.new is not None
        old, new = self._generations[self.old], self._generations[self.new]
        refusal = state_refusal(old.kinds, new.kinds, token=self._state_token)
        if refusal is not None:
            return self._abort(f"generation {new.number} cannot take the state: {refusal}")
        self.step = Step.PROVING
        actions = self._accept(new, new.live())
        self.current = new.number
        if old.state is GenerationState.SERVING:
            old.state = GenerationState.RETIRING
        actions += [StopAccepting(old.number), StartGrace(old.number)]
        return actions

    def _abort(self, why: str) -> list[Action]:
        assert self._handover is not None
        assert self.new is not None
        self._aborted[self.new] = (self._handover, why)  # ended once n's workers are gone
        actions = self._stop_generation(self.new, short=True)
        self.phase, self.step, self._handover = Phase.SERVING, None, None
        self.old = self.new = None
        return actions

    def _worker_exited(self, number: int, index: int, why: str) -> list[Action]:
        generation = self._generations.get(number)
        if generation is None or generation.workers[index] is WorkerState.EXITED:
            return []
        was = generation.workers[index]
        generation.workers[index] = WorkerState.EXITED
        actions: list[Action] = []
        if was in (WorkerState.STARTING, WorkerState.READY) and (
            generation.state is GenerationState.STARTING
        ):
            why = why or f"worker {index} exited before it was ready"
            actions += self._start_failed(number, why)
        elif self._replaces(generation):
            actions += self._schedule_replacement(generation, index)
        return actions + self._after_exit(generation)

    def _after_exit(self, generation: _Generation) -> list[Action]:
        if self._generations.get(generation.number) is not generation:
            return []  # forgotten already (the stop of a generation with no live worker forgets it)
        actions: list[Action] = []
        if generation.live() == () and generation.state in (
            GenerationState.STOPPING,
            GenerationState.STOPPED,
        ):
            generation.state = GenerationState.STOPPED
            del self._generations[generation.number]
            actions.append(Forget(generation.number))
            if generation.number in self._aborted:
                number, why = self._aborted.pop(generation.number)
                actions.append(HandoverEnded(number, False, why))
            if self.step is Step.STOPPING_OLD and generation.number == self.old:
                assert self._handover is not None
                actions.append(HandoverEnded(self._handover, True, old_drained=generation.drained))
                self.phase, self.step, self._handover = Phase.SERVING, None, None
                self.old = self.new = None
        return actions + self._maybe_exit()

    def _replaces(self, generation: _Generation) -> bool:
        """A lost worker of ``generation`` is replaced: it is the one that serves, outside a
        stop, serving or held by an orchestrator's drain (its replacement joins that drain, so
        the drain's status and rollback stay reachable and the rollback finds every worker)."""
        return (
            self.phase is not Phase.STOPPING
            and generation.number == self.current
            and generation.state in _REPLACEABLE
        )

    def _schedule_replacement(self, generation: _Generation, index: int) -> list[Action]:
        attempt = generation.attempts.get(index, 0)
        if attempt >= len(REPLACE_BACKOFF):
            return []
        generation.attempts[index] = attempt + 1
        return [ScheduleReplacement(generation.number, index, attempt, REPLACE_BACKOFF[attempt])]

    def _start_timeout(self, number: int, index: int, why: str) -> list[Action]:
        generation = self._generations.get(number)
        if generation is None or generation.workers[index] is not WorkerState.STARTING:
            return []
        if generation.state is GenerationState.STARTING:
            return self._start_failed(number, why or f"worker {index} was not ready in time")
        return [self._stop(generation, (index,), short=True)]

    def _start_failed(self, number: int, why: str) -> list[Action]:
        generation = self._generations.get(number)
        if generation is None or generation.state is not GenerationState.STARTING:
            return []
        if self.phase is Phase.STARTING:
            self.phase = Phase.STOPPING
            self._queue_emptied = True
            return self._stop_generation(number, short=True) + self._maybe_exit()
        if self.phase is Phase.HANDING_OVER and number == self.new:
            return self._abort(f"generation {number} did not start: {why}")
        return self._stop_generation(number, short=True) + self._after_exit(generation)

    def _stop_generation(self, number: int, *, short: bool) -> list[Action]:
        """Stop the generation's workers; one told to stop already keeps its own timer."""
        generation = self._generations[number]
        generation.state = GenerationState.STOPPING
        if not generation.live():
            return self._after_exit(generation)
        running = tuple(
            i
            for i, w in enumerate(generation.workers)
            if w not in (WorkerState.EXITED, WorkerState.STOPPING)
        )
        return [self._stop(generation, running, short=short)] if running else []

    def _stop(
        self, generation: _Generation, indexes: tuple[int, ...], *, short: bool, force: bool = False
    ) -> StopWorkers:
        """These workers stop under a new timer of their own."""
        self._timers += 1
        for index in indexes:
            generation.workers[index] = WorkerState.STOPPING
            generation.timers[index] = self._timers
        return StopWorkers(generation.number, indexes, force=force, short=short, timer=self._timers)

    def _replace_due(self, number: int, index: int, attempt: int) -> list[Action]:
        generation = self._generations.get(number)
        if (
            generation is None
            or not self._replaces(generation)
            or generation.workers[index] is not WorkerState.EXITED
            or generation.attempts.get(index) != attempt + 1
        ):
            return []
        generation.workers[index] = WorkerState.STARTING
        return [StartWorker(number, index)]

    def _grace_over(self, number: int) -> list[Action]:
        if not (self.phase is Phase.HANDING_OVER and self.step is Step.PROVING):
            return []
        if number != self.old:
            return []
        old = self._generations[number]
        self.step = Step.DRAINING
        if old.state is GenerationState.RETIRING:
            old.state = GenerationState.DRAINING
            old.drained = None
            return [BeginDrain(number, target=self.new)]
        if old.state is GenerationState.DRAINING:
            return []  # an orchestrator's drain: followed until it settles
        return self._old_settled()

    def _drain_begun(self, number: int) -> list[Action]:
        generation = self._generations.get(number)
        if generation is not None and generation.state in (
            GenerationState.SERVING,
            GenerationState.RETIRING,
            GenerationState.DRAINED,
            GenerationState.FAILED,
        ):
            generation.state = GenerationState.DRAINING
            generation.drained = None
            if self.phase is Phase.STOPPING:
                self._stop_drains.add(number)
        return []

    def _drain_rolled_back(self, number: int) -> list[Action]:
        generation = self._generations.get(number)
        if generation is None:
            return []
        if generation.state is GenerationState.STOPPING:
            # Its workers stop, each draining on its own: the outcome is no longer known.
            generation.drained = False
            if number in self._stop_drains:
                self._outcomes[number] = False
            return []
        if generation.state not in (
            GenerationState.DRAINING,
            GenerationState.DRAINED,
            GenerationState.FAILED,
        ):
            return []
        if self.phase is Phase.STOPPING:  # the stop drains it again
            generation.state, generation.drained = GenerationState.DRAINING, None
            self._outcomes.pop(number, None)
            return [BeginDrain(number)]
        if self.step not in (None, Step.STARTING) and number == self.old:
            # g stopped accepting; its intake is open again: the handover drains it anew.
            if self.step is Step.DRAINING:
                generation.drained = None
                return [BeginDrain(number, target=self.new)]
            generation.state, generation.drained = GenerationState.RETIRING, None
            return []
        generation.state = GenerationState.SERVING
        generation.drained = None
        return []

    def _drain_settled(self, number: int, drained: bool) -> list[Action]:
        generation = self._generations.get(number)
        if generation is None or generation.state is not GenerationState.DRAINING:
            return []
        generation.state = GenerationState.DRAINED if drained else GenerationState.FAILED
        generation.drained = drained
        if self.phase is Phase.STOPPING:
            self._outcomes[number] = drained
            return self._after_drains()
        if self.phase is Phase.HANDING_OVER and self.step is Step.DRAINING and number == self.old:
            return self._old_settled()
        return []

    def _old_settled(self) -> list[Action]:
        assert self.old is not None
        assert self.new is not None
        old = self._generations[self.old]
        if any(kind is not None for kind in old.kinds):
            self.step = Step.HANDING_STATE
            return [HandState(old.number, self.new)]
        self.step = Step.STOPPING_OLD
        return self._stop_generation(old.number, short=False)

    def _state_handed(self, number: int) -> list[Action]:
        if self.step is Step.HANDING_STATE and number == self.new and self.old is not None:
            self.step = Step.STOPPING_OLD
            return self._stop_generation(self.old, short=False)
        return []

    def _after_drains(self) -> list[Action]:
        """In the stop: once every drain settled, empty the queue."""
        if self._queue_emptied or self.forced:
            return self._maybe_exit()
        for number in self._stop_drains:
            generation = self._generations.get(number)
            if generation is not None and generation.state is GenerationState.DRAINING:
                return []
        self._queue_emptied = True
        return [EmptyQueue()]

    def _queue_empty(self) -> list[Action]:
        if self.phase is not Phase.STOPPING or self.forced:
            return []
        actions: list[Action] = []
        for number, generation in sorted(self._generations.items()):
            if generation.state is not GenerationState.STOPPING and generation.live():
                actions += self._stop_generation(number, short=False)
        return actions + self._maybe_exit()

    def _stop_timeout(self, number: int, timer: int) -> list[Action]:
        """Kill the workers this timer's stop still waits for (a later stop's are not its)."""
        generation = self._generations.get(number)
        if generation is None:
            return []
        stopping = tuple(
            i
            for i, w in enumerate(generation.workers)
            if w is WorkerState.STOPPING and generation.timers[i] == timer
        )
        return [Kill(number, stopping)] if stopping else []

    def _maybe_exit(self) -> list[Action]:
        if self.phase is not Phase.STOPPING or not self._queue_emptied:
            return []
        if any(generation.live() for generation in self._generations.values()):
            return []
        if self.forced:
            code, outcome = 1, "forced"
        elif self._stop_drains and all(self._outcomes.get(n, False) for n in self._stop_drains):
            code, outcome = 0, "drained"
        elif self._stop_drains:
            code, outcome = 1, "failed"
        else:
            code, outcome = 1, "not-started"
        self.phase, self.exit_code = Phase.STOPPED, code
        return [Exit(code, outcome)]
