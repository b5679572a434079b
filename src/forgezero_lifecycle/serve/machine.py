"""The supervisor's decisions, without I/O: events in, actions out (``serve --workers N``).

:class:`SupervisorMachine` owns every state the supervisor decides on: its own :class:`Phase`
(and, while handing over, the :class:`Step`), each generation's :class:`GenerationState` and
each worker's :class:`WorkerState`. They change only in its methods, and only as the table below
says. The I/O layer (:mod:`.supervisor` with :mod:`.workers`: processes,
sockets, signals, the channel) turns what happens into an event, hands it to
:meth:`SupervisorMachine.handle`, and carries out the actions it gets back, in order.

Phases (``g`` is the current generation, ``n`` the one a handover starts)::

    starting ──all of g ready──▶ serving ──reload──▶ handing over ──n serves, g stopped──▶ serving
       │                           │                    │ (aborted: n stopped, g untouched)
       └──stop signal──────────────┴──stop signal───────┴──────────▶ stopping ──▶ stopped

A handover's steps: ``starting`` (n's workers start and import the app, each within the start
timeout) → ``proving`` (every worker of n is ready and can take g's state: n accepts and
proves it serves while g serves on, within the start timeout, else the handover is abandoned;
then g stops accepting and the handover grace lets g's keep-alive clients move over) →
``draining`` (g
drains under its deadline) → ``handing-state`` (only when the app has a state adapter: worker k
of g to worker k of n) → ``stopping-old`` (g's workers stop) → serving.

A generation: ``starting`` → ``serving`` (its workers accept on the shared listener; never before
all of them are ready) → ``retiring`` (a handover told it to stop accepting) → ``draining`` →
``drained`` | ``failed`` → ``stopping`` → ``stopped`` (then forgotten). A worker: ``starting`` →
``ready`` → ``accepting`` → ``stopping`` → ``exited`` (any state may go to ``exited``).

Every (phase, event) pair is one entry of :data:`TABLE`, data in this module: a
:class:`Transition` (the handler below decides, as its text says), :class:`Stale` (ignored on
purpose: what the event reports is over, for the reason given) or :class:`Impossible` (no I/O
layer can report it there: the machine raises :class:`ImpossibleEventError` and the supervisor
fails loudly). The table below, the one in ``docs/supervisor-states.md`` and its state diagram
are rendered from :data:`TABLE` (``python -m forgezero_lifecycle.serve.machine --write``);
``tests/serve/test_supervisor_table.py`` fails when either differs from it. A timer belongs to
the step that set it: a stop timer kills only the workers that very stop still waits for. An
action that begins something (:data:`BEGINNINGS`) decided before a stop is never carried out
after it (:meth:`outdated`).

Every (phase, event) pair (rendered from :data:`TABLE`)::

    Reload (reload (SIGHUP or request)):
      starting: refused: the first generation is still starting
      serving: refused while an orchestrator's drain holds g (until its rollback); else a worker
          replacement running ends (its new worker stops; an unresponsive worker is killed),
          start generation n, the handover's step is starting
      handing-over: refused: one handover at a time
      stopping: refused: the supervisor is stopping
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    StopSignal (stop signal (SIGTERM, SIGINT)):
      starting: stop every worker (none accepted yet) under the short bound; exit 1 once gone
      serving: drain g under the stop's deadline; a replacement still starting stops (short
          bound); a worker handing over drains on under its own bound
      handing-over: the handover ends. n not accepting yet: stop n (short bound), drain g; after
          the switch: drain g and n, both begun now under one deadline
      stopping: the second signal forces: stop every worker now, kill after the forced bound,
          exit 1
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    WorkerReady (worker ready):
      starting: all of g ready: g accepts, serving
      serving: a replacement: it accepts (joining its generation's drain first, if one holds
          it); one that takes a worker's place: then that worker stops accepting, hands its
          clients over and drains (full bound), or is killed if unresponsive; the next
          replacement begins
      handing-over: n all ready: the state refused → abort (n stops, g untouched), else n
          accepts and proves it serves while g serves on; a replacement of the serving
          generation accepts
      stopping: *stale*: every worker not ready when the stop began was told to stop then: its
          ready is late
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    WorkerExited (worker exited):
      starting: the start failed: stop the rest, exit 1 once gone
      serving: its generation serving, or held by an orchestrator's drain: replace it after a
          backoff; a worker that left for good (recycled, scaled down, unresponsive) is not
          replaced; a new worker that did not start ends its replacement; else recorded
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
    ProofSettled (proof settled (n serves, or not within the start timeout)):
      starting: *impossible* (raises): only a handover's new generation is proved
      serving: *stale*: the proof of a handover that ended before it was in
      handing-over: proving: proved → n serves, g stops accepting, the grace starts (a worker of
          n lost meanwhile is replaced); not in time → abandoned: n's workers hand their clients
          back and drain on their own bound, g serves on untouched
      stopping: *stale*: the proof of the handover the stop ended
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
    LimitReached (limit reached (recycling)):
      starting: *impossible* (raises): a worker counts toward its limits only once it accepts,
          and none accepts before the first generation serves
      serving: a worker of g that accepts is due: its replacement starts now or after the one
          running (one at a time); once it accepts, the worker hands over and drains
      handing-over: recorded: recycling pauses until the handover is done (then only for n's
          workers)
      stopping: *stale*: no worker starts into a stop: the stop drains the worker anyway
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    WorkerUnresponsive (worker unresponsive (heartbeat)):
      starting: *impossible* (raises): the heartbeat watches a worker only once it accepts, and
          none accepts before the first generation serves
      serving: a worker of g that accepts: its replacement starts first (before any recycling),
          and once that accepts the unresponsive worker is killed; any other: killed now
      handing-over: killed now: the handover replaces its generation (one of the generation that
          serves is replaced after a backoff, as any lost worker)
      stopping: killed now: it finishes nothing it admitted (its generation's drain fails for
          it)
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks
    Scale (scale (SIGTTIN, SIGTTOU or request)):
      starting: refused: the first generation is still starting
      serving: refused while an orchestrator's drain holds g, or below 1 or above the most
          workers; else g's size changes: a worker is added (ready, then it accepts), or the
          last that accepts hands its clients over and drains
      handing-over: refused: a handover is running
      stopping: refused: the supervisor is stopping
      stopped: *stale*: the supervisor has exited: a late report of one of its tasks

The invariants (checked after every step by ``tests/serve/test_supervisor_machine.py``): a worker
whose generation accepted is killed only when the stop was forced, its generation's drain has
settled, its own drain's bound is over (a worker that left alone: recycled, scaled down) or it
stopped answering the heartbeat; a stop drains every generation that holds admitted work, all
begun in the same step; no worker is started into a generation that stopped accepting; exit 0
only when every generation that accepted drained; at most one generation accepts between steps
(two only while a handover proves n: n accepts before g stops); an aborted handover never
touches g; one worker replacement at a time, begun only while the generation serves alone, and
the new worker accepts before the one it replaces stops accepting; a generation keeps 1 to
:data:`MAX_WORKERS` workers.

Replacing one worker while its generation serves on (recycling, the watchdog, scaling) is a
handover of one worker: the new worker starts in a free place of the generation (the place of
a worker that left for good, or a new one), is ready, accepts; only then does the worker it
replaces stop accepting, ask its keep-alive clients to reconnect (its siblings take them) and
drain under its own bound (``StopWorkers(hand_over=True)``), or, when its event loop stopped
answering, get killed. A replacement whose new worker does not start is given up: the worker
due keeps serving (an unresponsive one is killed, and replaced as any lost worker). A handover
or a stop gives up the replacement running and every one due: the handover replaces every
worker, and no worker starts into a stop.
"""

from __future__ import annotations

import enum
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, final

__all__ = [
    "BEGINNINGS",
    "EVENTS",
    "MAX_WORKERS",
    "REPLACE_BACKOFF",
    "SOURCES",
    "TABLE",
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
    "Impossible",
    "ImpossibleEventError",
    "Kill",
    "LimitReached",
    "Phase",
    "ProofSettled",
    "Prove",
    "QueueEmptied",
    "Refused",
    "Reload",
    "ReplaceDue",
    "ReplacementBegun",
    "ReplacementEnded",
    "Rule",
    "Scale",
    "Scaled",
    "ScheduleReplacement",
    "Stale",
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
    "Transition",
    "WorkerExited",
    "WorkerReady",
    "WorkerState",
    "WorkerUnresponsive",
    "render_docstring",
    "render_markdown",
    "render_mermaid",
    "state_refusal",
]


# The table: every (phase, event) pair, as data.


class Phase(enum.StrEnum):
    STARTING = "starting"
    SERVING = "serving"
    HANDING_OVER = "handing-over"
    STOPPING = "stopping"
    STOPPED = "stopped"


@final
@dataclass(frozen=True, slots=True)
class Transition:
    """The machine decides: what it does, and the phases it may move to (else it stays)."""

    does: str
    to: tuple[Phase, ...] = ()


@final
@dataclass(frozen=True, slots=True)
class Stale:
    """Ignored on purpose: why what the event reports is over."""

    why: str


@final
@dataclass(frozen=True, slots=True)
class Impossible:
    """No I/O layer reports it in this phase: why."""

    why: str


Rule = Transition | Stale | Impossible


@final
class ImpossibleEventError(RuntimeError):
    """The I/O layer reported an event its phase rules out: a bug in the supervisor."""

    code: Final = "RUNTIME_SUPERVISOR_BUG"


#: The events, in the table's order (the names of the classes in :mod:`.machine`), with the
#: words the documented table uses for each.
EVENTS: Final[Mapping[str, str]] = {
    "Reload": "reload (SIGHUP or request)",
    "StopSignal": "stop signal (SIGTERM, SIGINT)",
    "WorkerReady": "worker ready",
    "WorkerExited": "worker exited",
    "StartTimeout": "start timeout",
    "StartFailed": "start failed (revision unreadable)",
    "ReplaceDue": "replace due",
    "GraceOver": "grace over",
    "ProofSettled": "proof settled (n serves, or not within the start timeout)",
    "DrainBegun": "drain begun",
    "DrainRolledBack": "drain rolled back",
    "DrainSettled": "drain settled",
    "StateHanded": "state handed",
    "QueueEmptied": "queue emptied",
    "StopTimeout": "stop timeout",
    "LimitReached": "limit reached (recycling)",
    "WorkerUnresponsive": "worker unresponsive (heartbeat)",
    "Scale": "scale (SIGTTIN, SIGTTOU or request)",
}

_S, _V, _H, _T, _X = Phase  # the columns: starting, serving, handing over, stopping, stopped
_EXITED: Final = Stale("the supervisor has exited: a late report of one of its tasks")
_ONLY_IN_STOP: Final = Impossible("the accept queue is emptied only by a stop")
_NOT_ACCEPTING: Final = (
    "{what} only once it accepts, and none accepts before the first generation serves"
)
_UNACCEPTED: Final = (
    "the first generation has not accepted: it holds no admitted work, and a drain begun "
    "through a worker's private port changes only what the workers answer"
)

#: Every (phase, event) pair.
TABLE: Final[Mapping[tuple[Phase, str], Rule]] = {
    (_S, "Reload"): Transition("refused: the first generation is still starting"),
    (_V, "Reload"): Transition(
        "refused while an orchestrator's drain holds g (until its rollback); else a worker "
        "replacement running ends (its new worker stops; an unresponsive worker is killed), "
        "start generation n, the handover's step is starting",
        to=(_H,),
    ),
    (_H, "Reload"): Transition("refused: one handover at a time"),
    (_T, "Reload"): Transition("refused: the supervisor is stopping"),
    (_X, "Reload"): _EXITED,
    (_S, "StopSignal"): Transition(
        "stop every worker (none accepted yet) under the short bound; exit 1 once gone",
        to=(_T, _X),
    ),
    (_V, "StopSignal"): Transition(
        "drain g under the stop's deadline; a replacement still starting stops (short bound); "
        "a worker handing over drains on under its own bound",
        to=(_T,),
    ),
    (_H, "StopSignal"): Transition(
        "the handover ends. n not accepting yet: stop n (short bound), drain g; after the "
        "switch: drain g and n, both begun now under one deadline",
        to=(_T,),
    ),
    (_T, "StopSignal"): Transition(
        "the second signal forces: stop every worker now, kill after the forced bound, exit 1",
        to=(_X,),
    ),
    (_X, "StopSignal"): _EXITED,
    (_S, "WorkerReady"): Transition("all of g ready: g accepts, serving", to=(_V,)),
    (_V, "WorkerReady"): Transition(
        "a replacement: it accepts (joining its generation's drain first, if one holds it); "
        "one that takes a worker's place: then that worker stops accepting, hands its clients "
        "over and drains (full bound), or is killed if unresponsive; the next replacement begins"
    ),
    (_H, "WorkerReady"): Transition(
        "n all ready: the state refused → abort (n stops, g untouched), else n accepts and "
        "proves it serves while g serves on; a replacement of the serving generation accepts",
        to=(_V,),
    ),
    (_T, "WorkerReady"): Stale(
        "every worker not ready when the stop began was told to stop then: its ready is late"
    ),
    (_X, "WorkerReady"): _EXITED,
    (_S, "WorkerExited"): Transition(
        "the start failed: stop the rest, exit 1 once gone", to=(_T, _X)
    ),
    (_V, "WorkerExited"): Transition(
        "its generation serving, or held by an orchestrator's drain: replace it after a "
        "backoff; a worker that left for good (recycled, scaled down, unresponsive) is not "
        "replaced; a new worker that did not start ends its replacement; else recorded"
    ),
    (_H, "WorkerExited"): Transition(
        "a worker of n before the switch: abort (n stops, g untouched); of the generation "
        "that serves (or is held by an orchestrator's drain): replace it after a backoff; the "
        "last of g in stopping-old: done",
        to=(_V,),
    ),
    (_T, "WorkerExited"): Transition(
        "recorded; every worker gone and the drains settled: exit", to=(_X,)
    ),
    (_X, "WorkerExited"): _EXITED,
    (_S, "StartTimeout"): Transition("as worker exited: the start failed", to=(_T, _X)),
    (_V, "StartTimeout"): Transition(
        "a replacement: stop it (short bound); replaced again once it exited"
    ),
    (_H, "StartTimeout"): Transition(
        "a worker of n: abort; a replacement: stop it (short bound)", to=(_V,)
    ),
    (_T, "StartTimeout"): Stale(
        "every worker still starting was told to stop when the stop began, under its own timer"
    ),
    (_X, "StartTimeout"): _EXITED,
    (_S, "StartFailed"): Impossible("the first generation's revision is read before the start"),
    (_V, "StartFailed"): Impossible(
        "a revision is read only as a handover's generation starts, and the handover runs "
        "until that generation reported"
    ),
    (_H, "StartFailed"): Transition("n could not start: abort, g untouched", to=(_V,)),
    (_T, "StartFailed"): Impossible(
        "a generation's start decided before the stop is never carried out after it"
    ),
    (_X, "StartFailed"): _EXITED,
    (_S, "ReplaceDue"): Impossible("a replacement is scheduled only in an accepting generation"),
    (_V, "ReplaceDue"): Transition(
        "its generation still the one that serves: start the worker again"
    ),
    (_H, "ReplaceDue"): Transition(
        "its generation still the one that serves: start the worker again"
    ),
    (_T, "ReplaceDue"): Stale("no worker starts into a stop: the replacement is dropped"),
    (_X, "ReplaceDue"): _EXITED,
    (_S, "GraceOver"): Impossible("a grace starts only at a handover's switch"),
    (_V, "GraceOver"): Impossible("a handover ends only after its grace is over"),
    (_H, "GraceOver"): Transition(
        "proving: drain g (or follow an orchestrator's drain of g; a g with no worker left "
        "stops at once: done)",
        to=(_V,),
    ),
    (_T, "GraceOver"): Stale("the grace of the handover the stop ended"),
    (_X, "GraceOver"): _EXITED,
    (_S, "ProofSettled"): Impossible("only a handover's new generation is proved"),
    (_V, "ProofSettled"): Stale("the proof of a handover that ended before it was in"),
    (_H, "ProofSettled"): Transition(
        "proving: proved → n serves, g stops accepting, the grace starts (a worker of n lost "
        "meanwhile is replaced); not in time → abandoned: n's workers hand their clients back "
        "and drain on their own bound, g serves on untouched",
        to=(_V,),
    ),
    (_T, "ProofSettled"): Stale("the proof of the handover the stop ended"),
    (_X, "ProofSettled"): _EXITED,
    (_S, "DrainBegun"): Stale(_UNACCEPTED),
    (_V, "DrainBegun"): Transition(
        "g draining (an orchestrator's drain): a worker lost meanwhile is replaced and joins it"
    ),
    (_H, "DrainBegun"): Transition("recorded: the generation drains; the handover follows it"),
    (_T, "DrainBegun"): Transition("recorded: the stop waits for it too"),
    (_X, "DrainBegun"): _EXITED,
    (_S, "DrainRolledBack"): Stale(_UNACCEPTED),
    (_V, "DrainRolledBack"): Transition("g serving again"),
    (_H, "DrainRolledBack"): Transition(
        "g after the switch: retiring again (in step draining its drain begins anew); before "
        "the switch, or n: serving again"
    ),
    (_T, "DrainRolledBack"): Transition(
        "its intake opened again: the stop drains it again (a generation already stopping: "
        "its outcome is unknown, recorded failed)"
    ),
    (_X, "DrainRolledBack"): _EXITED,
    (_S, "DrainSettled"): Stale(_UNACCEPTED),
    (_V, "DrainSettled"): Transition("recorded (an orchestrator's drain)"),
    (_H, "DrainSettled"): Transition(
        "g in step draining: hand the state over, or stop g (full bound; no worker left: "
        "done); else recorded",
        to=(_V,),
    ),
    (_T, "DrainSettled"): Transition(
        "the last of the stop's drains: empty the accept queue (forced: exit)", to=(_X,)
    ),
    (_X, "DrainSettled"): _EXITED,
    (_S, "StateHanded"): Impossible("a state transfer runs only in a handover"),
    (_V, "StateHanded"): Impossible("a handover ends only after its state transfer"),
    (_H, "StateHanded"): Transition(
        "handing-state: stop g (full bound; no worker left: done)", to=(_V,)
    ),
    (_T, "StateHanded"): Stale("the transfer of the handover the stop ended"),
    (_X, "StateHanded"): _EXITED,
    (_S, "QueueEmptied"): _ONLY_IN_STOP,
    (_V, "QueueEmptied"): _ONLY_IN_STOP,
    (_H, "QueueEmptied"): _ONLY_IN_STOP,
    (_T, "QueueEmptied"): Transition("stop every worker left (full bound)", to=(_X,)),
    (_X, "QueueEmptied"): _EXITED,
    (_S, "StopTimeout"): Impossible(
        "no worker is stopped before the first generation serves (a failed start is a stop)"
    ),
    (_V, "StopTimeout"): Transition("kill the workers that stop left, if any is still running"),
    (_H, "StopTimeout"): Transition("kill the workers that stop left, if any is still running"),
    (_T, "StopTimeout"): Transition("kill the workers that stop left, if any is still running"),
    (_X, "StopTimeout"): _EXITED,
    (_S, "LimitReached"): Impossible(
        _NOT_ACCEPTING.format(what="a worker counts toward its limits")
    ),
    (_V, "LimitReached"): Transition(
        "a worker of g that accepts is due: its replacement starts now or after the one "
        "running (one at a time); once it accepts, the worker hands over and drains"
    ),
    (_H, "LimitReached"): Transition(
        "recorded: recycling pauses until the handover is done (then only for n's workers)"
    ),
    (_T, "LimitReached"): Stale("no worker starts into a stop: the stop drains the worker anyway"),
    (_X, "LimitReached"): _EXITED,
    (_S, "WorkerUnresponsive"): Impossible(
        _NOT_ACCEPTING.format(what="the heartbeat watches a worker")
    ),
    (_V, "WorkerUnresponsive"): Transition(
        "a worker of g that accepts: its replacement starts first (before any recycling), and "
        "once that accepts the unresponsive worker is killed; any other: killed now"
    ),
    (_H, "WorkerUnresponsive"): Transition(
        "killed now: the handover replaces its generation (one of the generation that serves "
        "is replaced after a backoff, as any lost worker)"
    ),
    (_T, "WorkerUnresponsive"): Transition(
        "killed now: it finishes nothing it admitted (its generation's drain fails for it)"
    ),
    (_X, "WorkerUnresponsive"): _EXITED,
    (_S, "Scale"): Transition("refused: the first generation is still starting"),
    (_V, "Scale"): Transition(
        "refused while an orchestrator's drain holds g, or below 1 or above the most workers; "
        "else g's size changes: a worker is added (ready, then it accepts), or the last that "
        "accepts hands its clients over and drains"
    ),
    (_H, "Scale"): Transition("refused: a handover is running"),
    (_T, "Scale"): Transition("refused: the supervisor is stopping"),
    (_X, "Scale"): _EXITED,
}


if TYPE_CHECKING:  # pydantic's module: the machine imports nothing of the wire at run time
    from ..wire.supervisor import HandoverFailure


#: Pauses before each attempt to replace a worker that died while its generation served.
REPLACE_BACKOFF: Final = (0.0, 0.5, 1.0, 2.0, 5.0, 10.0)
#: The most workers a generation may have (``--workers``, and scaling up); a handover runs two
#: generations side by side for a moment.
MAX_WORKERS: Final = 64


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
    #: The worker's own stop failed: told to stop, it exited with a failure status (its app's
    #: lifespan shutdown overran what was left of the deadline, say).
    failed: bool = False


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
class ProofSettled:
    """The proof that a handover's new generation serves: every worker of it answered after it
    began accepting (``proved``), or not within the start timeout (``why`` says which did not)."""

    generation: int
    proved: bool
    why: str = ""


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


@dataclass(frozen=True, slots=True)
class LimitReached:
    """Worker ``index`` passed one of its recycling limits (``--max-requests`` with its
    jitter, ``--max-worker-memory``, ``--max-worker-lifetime``); ``why`` says which."""

    generation: int
    index: int
    why: str = ""


@dataclass(frozen=True, slots=True)
class WorkerUnresponsive:
    """Worker ``index``'s event loop did not answer the heartbeat within ``--worker-timeout``."""

    generation: int
    index: int
    why: str = ""


@dataclass(frozen=True, slots=True)
class Scale:
    """SIGTTIN (``by=1``), SIGTTOU (``by=-1``) or ``POST supervisor/v1/scale``."""

    by: int
    request: bool = False


Event = (
    Reload
    | StopSignal
    | WorkerReady
    | WorkerExited
    | StartTimeout
    | StartFailed
    | ReplaceDue
    | GraceOver
    | ProofSettled
    | DrainBegun
    | DrainRolledBack
    | DrainSettled
    | StateHanded
    | QueueEmptied
    | StopTimeout
    | LimitReached
    | WorkerUnresponsive
    | Scale
)

# Actions: what the I/O layer must do, in the order given.


@dataclass(frozen=True, slots=True)
class StartGeneration:
    """Read the revision (not for the first) and start its ``workers`` workers, each with a
    start timer."""

    generation: int
    workers: int


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
class Prove:
    """Prove that the generation's workers serve now that they accept (each answers through its
    own server after its accept), within the start timeout; report :class:`ProofSettled`."""

    generation: int
    indexes: tuple[int, ...]


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
    """Each worker of ``old`` hands its state to its partner in ``new`` (``pairs``: the index in
    ``old``, the index in ``new``; by default worker k to worker k); report
    :class:`StateHanded`."""

    old: int
    new: int
    pairs: tuple[tuple[int, int], ...] = ()


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
    #: One worker leaves a generation that serves on (recycled, scaled down): it stops
    #: accepting and asks its keep-alive clients to reconnect first, as a handover's generation
    #: does, then drains (its siblings take the clients).
    hand_over: bool = False


@dataclass(frozen=True, slots=True)
class Kill:
    """SIGKILL these workers (``unresponsive``: they did not answer the heartbeat)."""

    generation: int
    indexes: tuple[int, ...]
    unresponsive: bool = False


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
    #: Why it was aborted, as its stable code (None when it is done).
    failure: HandoverFailure | None = None
    #: How g's drain settled (a handover that is done): True drained, False failed.
    old_drained: bool | None = None
    #: Ended by the stop (``detail`` says what the stop does with each generation), not
    #: aborted with g serving on.
    by_stop: bool = False


@dataclass(frozen=True, slots=True)
class Refused:
    """A reload (or a scaling) that cannot begin now (logged; the request answers 409)."""

    why: str
    what: Literal["reload", "scale"] = "reload"


#: Why a worker is replaced while its generation serves on.
ReplacementKind = Literal["recycle", "unresponsive", "scale-up"]


@dataclass(frozen=True, slots=True)
class ReplacementBegun:
    """Worker ``new`` starts to take the place of worker ``old`` (None: a worker added)."""

    generation: int
    new: int
    old: int | None
    kind: ReplacementKind
    why: str


@dataclass(frozen=True, slots=True)
class ReplacementEnded:
    """The replacement begun for worker ``new`` ended: ``done`` (it accepts, and ``old`` was
    told to hand over and drain, or was killed), or given up (``detail`` says why)."""

    generation: int
    new: int
    old: int | None
    kind: ReplacementKind
    done: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Scaled:
    """The generation's size is now ``workers`` (``by`` one more or one less)."""

    workers: int
    by: int


@dataclass(frozen=True, slots=True)
class Exit:
    code: int
    #: What the stop reports: ``drained``, ``failed``, ``forced``, ``not-started``, or
    #: ``worker-failed`` (drained, but a worker's own stop failed).
    outcome: str


Action = (
    StartGeneration
    | StartWorker
    | ScheduleReplacement
    | Accept
    | Prove
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
    | ReplacementBegun
    | ReplacementEnded
    | Scaled
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
    if len(old) != len(new):
        return (
            f"{len(old)} workers hold state and the new generation has {len(new)}: the state is "
            "handed worker by worker"
        )
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
    #: The places of workers that left for good (recycled, scaled down, unresponsive, or a
    #: replacement that never served): not replaced when they exit; a new worker may take one.
    retired: set[int] = field(default_factory=set)

    def live(self) -> tuple[int, ...]:
        return tuple(i for i, w in enumerate(self.workers) if w is not WorkerState.EXITED)

    def members(self) -> tuple[int, ...]:
        """The workers that make up its size (a lost one included until it is replaced)."""
        return tuple(i for i in range(len(self.workers)) if i not in self.retired)

    def place(self) -> int:
        """A place for a new worker, starting: a retired one whose worker is gone, else a new one."""
        free = [i for i in sorted(self.retired) if self.workers[i] is WorkerState.EXITED]
        if free:
            index = free[0]
            self.retired.discard(index)
            self.workers[index] = WorkerState.STARTING
            self.kinds[index] = None
            self.timers[index] = 0
            self.attempts.pop(index, None)
            return index
        self.workers.append(WorkerState.STARTING)
        self.kinds.append(None)
        self.timers.append(0)
        return len(self.workers) - 1


@final
@dataclass(frozen=True, slots=True)
class _Swap:
    """The running replacement of one worker (one at a time)."""

    generation: int
    new: int
    old: int | None
    kind: ReplacementKind
    why: str


@final
class SupervisorMachine:
    """The supervisor's states and the table of its decisions (see the module docstring)."""

    def __init__(
        self, workers: int, *, state_token: bool = False, max_workers: int = MAX_WORKERS
    ) -> None:
        self._size = workers
        self._max_workers = max_workers
        #: The replacement running (a recycled, an unresponsive or an added worker), if any.
        self._swap: _Swap | None = None
        #: Workers due to be replaced, in the order they became due: (generation, index) →
        #: (why they are replaced, the detail).
        self._due: dict[tuple[int, int], tuple[ReplacementKind, str]] = {}
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
        self._aborted: dict[int, tuple[int, HandoverFailure, str]] = {}
        self.forced = False
        #: The generations the stop waits for: each that accepted, with its drain's outcome.
        self._stop_drains: set[int] = set()
        self._outcomes: dict[int, bool] = {}
        self._queue_emptied = False
        self.exit_code: int | None = None
        #: A worker's own stop failed during this stop (the exit is 1 even if it drained).
        self._worker_stop_failed = False
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

    @property
    def size(self) -> int:
        """The workers a generation is to have (``--workers``, changed by scaling)."""
        return self._size

    def retired(self, number: int) -> frozenset[int]:
        """The places of the generation's workers that left for good."""
        found = self._generations.get(number)
        return frozenset() if found is None else frozenset(found.retired)

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
        return [StartGeneration(self.current, self._size)]

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
        actions += self._forget()
        return actions + self._reconcile()

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
            case WorkerExited(generation=number, index=index, why=why, failed=failed):
                if failed and self.phase is Phase.STOPPING:
                    self._worker_stop_failed = True
                return self._worker_exited(number, index, why)
            case StartTimeout(generation=number, index=index, why=why):
                return self._start_timeout(number, index, why)
            case StartFailed(generation=number, why=why):
                return self._start_failed(number, why)
            case ReplaceDue(generation=number, index=index, attempt=attempt):
                return self._replace_due(number, index, attempt)
            case GraceOver(generation=number):
                return self._grace_over(number)
            case ProofSettled(generation=number, proved=proved, why=why):
                return self._proof_settled(number, proved, why)
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
            case LimitReached(generation=number, index=index, why=why):
                return self._limit_reached(number, index, why)
            case WorkerUnresponsive(generation=number, index=index, why=why):
                return self._unresponsive(number, index, why)
            case Scale(by=by):
                return self._scale(by)

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
        given_up = self._give_up("a handover replaces the generation", failed=False)
        self._due.clear()  # the handover replaces every worker
        self.old, self.new = self.current, self._new_generation()
        self._handovers += 1
        self._handover = self._handovers
        self.phase, self.step = Phase.HANDING_OVER, Step.STARTING
        began = HandoverBegun(self._handover, self.old, self.new)
        return [*given_up, began, StartGeneration(self.new, self._size)]

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
            actions.append(
                HandoverEnded(self._handover, False, what, "RUNTIME_HANDOVER_STOPPED", by_stop=True)
            )
            self._handover, self.old, self.new, self.step = None, None, None, None
        actions += self._give_up("the supervisor stops", failed=False)
        self._due.clear()
        self.phase = Phase.STOPPING
        for number, generation in sorted(self._generations.items()):
            if not generation.accepted or number in self._aborted:
                continue  # an abandoned n's workers each hand over and drain on their own bound
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
        swap = self._swap
        ours = swap is not None and (swap.generation, swap.new) == (number, index)
        if self._replaces(generation):
            generation.attempts.pop(index, None)
            actions = self._accept(generation, (index,))
            return actions + (self._swap_done() if ours else [])
        # A replacement whose generation stopped accepting meanwhile: it stops again.
        actions = [self._stop(generation, (index,), short=True)]
        if ours:
            actions += self._give_up(f"generation {number} stopped accepting", failed=False)
        return actions

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
        """Every worker of n is ready: n accepts and proves it serves (or the handover aborts);
        g serves on until the proof is in."""
        assert self.old is not None
        assert self.new is not None
        old, new = self._generations[self.old], self._generations[self.new]
        kinds = [old.kinds[index] for index in old.members()]
        refusal = state_refusal(kinds, new.kinds, token=self._state_token)
        if refusal is not None:
            return self._abort(
                "RUNTIME_HANDOVER_STATE_REFUSED",
                f"generation {new.number} cannot take the state: {refusal}",
            )
        self.step = Step.PROVING
        live = new.live()
        return [*self._accept(new, live), Prove(new.number, live)]

    def _proof_settled(self, number: int, proved: bool, why: str) -> list[Action]:
        """n proved it serves: it is the one that serves, g stops accepting and the grace
        starts. Not in time: the handover is abandoned, n's workers hand their clients back to
        g and drain on their own bound, g serves on untouched."""
        if self.step is not Step.PROVING or number != self.new or self.current == number:
            return []  # the proof of a handover that ended, or one already in
        assert self.old is not None
        if not proved:
            return self._abort(
                "RUNTIME_HANDOVER_NOT_PROVED", f"generation {number} did not prove it serves: {why}"
            )
        old, new = self._generations[self.old], self._generations[number]
        self.current = number
        if old.state is GenerationState.SERVING:
            old.state = GenerationState.RETIRING
        actions: list[Action] = [StopAccepting(old.number), StartGrace(old.number)]
        for index in new.members():  # one lost while it proved: replaced as n now serves
            if new.workers[index] is WorkerState.EXITED:
                actions += self._schedule_replacement(new, index)
        return actions

    def _abort(self, failure: HandoverFailure, why: str) -> list[Action]:
        assert self._handover is not None
        assert self.new is not None
        self._aborted[self.new] = (self._handover, failure, why)  # ended once n's are gone
        new = self._generations[self.new]
        if new.accepted:  # proving: each worker hands its clients back to g and drains alone
            running = tuple(i for i, w in enumerate(new.workers) if w is WorkerState.ACCEPTING)
            new.state = GenerationState.STOPPING
            new.retired.update(running)
            actions: list[Action] = (
                [self._stop(new, running, short=False, hand_over=True)]
                if running
                else self._after_exit(new)
            )
        else:
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
        swap = self._swap
        if was in (WorkerState.STARTING, WorkerState.READY) and (
            generation.state is GenerationState.STARTING
        ):
            why = why or f"worker {index} exited before it was ready"
            actions += self._start_failed(number, why)
        elif swap is not None and (swap.generation, swap.new) == (number, index):
            actions += self._give_up(why or f"worker {index} exited before it was ready")
        elif index in generation.retired:
            pass  # it left for good: recycled, scaled down, unresponsive
        elif swap is not None and (swap.generation, swap.old) == (number, index):
            generation.retired.add(index)  # the worker on its way takes its place
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
                number, failure, why = self._aborted.pop(generation.number)
                actions.append(HandoverEnded(number, False, why, failure))
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
            return self._abort(
                "RUNTIME_HANDOVER_START_FAILED", f"generation {number} did not start: {why}"
            )
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
        self,
        generation: _Generation,
        indexes: tuple[int, ...],
        *,
        short: bool,
        force: bool = False,
        hand_over: bool = False,
    ) -> StopWorkers:
        """These workers stop under a new timer of their own."""
        self._timers += 1
        for index in indexes:
            generation.workers[index] = WorkerState.STOPPING
            generation.timers[index] = self._timers
        return StopWorkers(
            generation.number,
            indexes,
            force=force,
            short=short,
            timer=self._timers,
            hand_over=hand_over,
        )

    def _replace_due(self, number: int, index: int, attempt: int) -> list[Action]:
        generation = self._generations.get(number)
        if (
            generation is None
            or not self._replaces(generation)
            or index in generation.retired
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
        members = old.members()
        if any(old.kinds[index] is not None for index in members):
            self.step = Step.HANDING_STATE
            new = self._generations[self.new]
            pairs = tuple(zip(members, range(len(new.workers)), strict=False))
            return [HandState(old.number, self.new, pairs)]
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

    # Replacing one worker while its generation serves on: recycling, the watchdog, scaling.

    def _limit_reached(self, number: int, index: int, why: str) -> list[Action]:
        """Due to be recycled: now, after the replacement running, or once the handover is done
        (:meth:`_reconcile` begins it)."""
        generation = self._generations.get(number)
        if (
            generation is None
            or number != self.current
            or not self._accepts(generation, index)
            or self._replacing(number, index)
        ):
            return []
        self._due.setdefault((number, index), ("recycle", why))
        return []

    def _unresponsive(self, number: int, index: int, why: str) -> list[Action]:
        """A worker of the serving generation that accepts is replaced first, then killed; any
        other (retiring, starting, or in a handover or a stop) is killed now."""
        generation = self._generations.get(number)
        if generation is None or generation.workers[index] is WorkerState.EXITED:
            return []
        if (
            self.phase is Phase.SERVING
            and number == self.current
            and self._accepts(generation, index)
        ):
            swap = self._swap
            if swap is not None and self._replacing(number, index):
                self._swap = _Swap(number, swap.new, index, "unresponsive", why)
            else:
                self._due[(number, index)] = ("unresponsive", why)
            return []
        return [Kill(number, (index,), unresponsive=True)]

    def _scale(self, by: int) -> list[Action]:
        if self.phase is Phase.STARTING:
            return [Refused("the first generation is still starting", "scale")]
        if self.phase is Phase.STOPPING:
            return [Refused("the supervisor is stopping", "scale")]
        if self.phase is Phase.HANDING_OVER:
            return [Refused("a handover is running: scale once it is done", "scale")]
        assert self.current is not None
        if self._generations[self.current].state is not GenerationState.SERVING:
            return [
                Refused(f"a drain holds generation {self.current}: roll it back first", "scale")
            ]
        size = self._size + by
        if not 1 <= size <= self._max_workers:
            return [
                Refused(
                    f"a generation has 1 to {self._max_workers} workers; it has {self._size}",
                    "scale",
                )
            ]
        self._size = size
        return [Scaled(size, by)]

    def _accepts(self, generation: _Generation, index: int) -> bool:
        return index not in generation.retired and generation.workers[index] is (
            WorkerState.ACCEPTING
        )

    def _replacing(self, number: int, index: int) -> bool:
        swap = self._swap
        return swap is not None and (swap.generation, swap.old) == (number, index)

    def _reconcile(self) -> list[Action]:
        """While the generation serves (no handover, stop or orchestrator's drain) and no
        replacement runs: remove the workers over its size, then begin the next replacement
        (an unresponsive worker's first, then a worker added, then a recycled one)."""
        if self.phase is not Phase.SERVING or self._swap is not None or self.current is None:
            return []
        generation = self._generations.get(self.current)
        if generation is None or generation.state is not GenerationState.SERVING:
            return []
        for number, index in list(self._due):
            if number != generation.number or not self._accepts(generation, index):
                del self._due[(number, index)]
        actions: list[Action] = []
        while len(generation.members()) > self._size:
            retired = self._retire_one(generation)
            if retired is None:
                break  # once another worker accepts
            actions += retired
        hung = [index for (_, index), (kind, _) in self._due.items() if kind == "unresponsive"]
        if hung:
            return actions + self._begin_swap(generation, hung[0])
        if len(generation.members()) < self._size:
            return actions + self._begin_swap(generation, None)
        if self._due:
            (_, index), _ = next(iter(self._due.items()))
            return actions + self._begin_swap(generation, index)
        return actions

    def _retire_one(self, generation: _Generation) -> list[Action] | None:
        """One worker fewer: a lost one not replaced yet, else the last that accepts (it hands
        its clients over and drains); None while no other worker accepts."""
        members = generation.members()
        lost = [i for i in members if generation.workers[i] is WorkerState.EXITED]
        if lost:
            generation.retired.add(lost[-1])
            return []
        accepting = [i for i in members if generation.workers[i] is WorkerState.ACCEPTING]
        if len(accepting) < 2:
            return None
        victim = accepting[-1]
        generation.retired.add(victim)
        self._due.pop((generation.number, victim), None)
        return [self._stop(generation, (victim,), short=False, hand_over=True)]

    def _begin_swap(self, generation: _Generation, old: int | None) -> list[Action]:
        if old is None:
            kind: ReplacementKind = "scale-up"
            why = f"scaled to {self._size} workers"
        else:
            kind, why = self._due.pop((generation.number, old))
        new = generation.place()
        self._swap = _Swap(generation.number, new, old, kind, why)
        return [
            ReplacementBegun(generation.number, new, old, kind, why),
            StartWorker(generation.number, new),
        ]

    def _swap_done(self) -> list[Action]:
        """The new worker accepts: the one it replaces hands over and drains (killed, when it
        is unresponsive)."""
        swap = self._swap
        assert swap is not None
        self._swap = None
        generation = self._generations[swap.generation]
        actions: list[Action] = []
        old = swap.old
        if old is not None and generation.workers[old] is not WorkerState.EXITED:
            generation.retired.add(old)
            if swap.kind == "unresponsive":
                actions.append(Kill(generation.number, (old,), unresponsive=True))
            elif generation.workers[old] is not WorkerState.STOPPING:
                actions.append(self._stop(generation, (old,), short=False, hand_over=True))
        ended = ReplacementEnded(generation.number, swap.new, old, swap.kind, done=True)
        return [*actions, ended]

    def _give_up(self, detail: str, *, failed: bool = True) -> list[Action]:
        """The running replacement ends without its new worker (``failed``: it did not start;
        an added worker is then no longer wanted). An unresponsive worker is killed now: it is
        replaced as any lost worker is."""
        swap = self._swap
        if swap is None:
            return []
        self._swap = None
        generation = self._generations.get(swap.generation)
        actions: list[Action] = []
        if generation is not None:
            generation.retired.add(swap.new)
            if generation.workers[swap.new] in (WorkerState.STARTING, WorkerState.READY):
                actions.append(self._stop(generation, (swap.new,), short=True))
            old = swap.old
            if (
                swap.kind == "unresponsive"
                and old is not None
                and generation.workers[old] is not WorkerState.EXITED
            ):
                actions.append(Kill(generation.number, (old,), unresponsive=True))
        if failed and swap.kind == "scale-up":
            self._size = max(1, self._size - 1)
        ended = ReplacementEnded(swap.generation, swap.new, swap.old, swap.kind, False, detail)
        return [*actions, ended]

    def _maybe_exit(self) -> list[Action]:
        if self.phase is not Phase.STOPPING or not self._queue_emptied:
            return []
        if any(generation.live() for generation in self._generations.values()):
            return []
        if self.forced:
            code, outcome = 1, "forced"
        elif self._stop_drains and all(self._outcomes.get(n, False) for n in self._stop_drains):
            code, outcome = (1, "worker-failed") if self._worker_stop_failed else (0, "drained")
        elif self._stop_drains:
            code, outcome = 1, "failed"
        else:
            code, outcome = 1, "not-started"
        self.phase, self.exit_code = Phase.STOPPED, code
        return [Exit(code, outcome)]


# The documented tables, rendered from TABLE.


def _cell(rule: Rule) -> str:
    match rule:
        case Transition(does=does):
            return does
        case Stale(why=why):
            return f"*stale*: {why}"
        case Impossible(why=why):
            return f"*impossible* (raises): {why}"


def render_markdown() -> str:
    """The table of ``docs/supervisor-states.md``: one row per event, one column per phase."""
    header = "| event | " + " | ".join(f"`{phase}`" for phase in Phase) + " |"
    lines = [header, "|---" * (len(Phase) + 1) + "|"]
    for event, words in EVENTS.items():
        cells = [_cell(TABLE[(phase, event)]).replace("|", "\\|") for phase in Phase]
        lines.append(f"| {words} (`{event}`) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_mermaid() -> str:
    """The phases' state diagram (Mermaid): an arrow per event that may change the phase."""
    lines = ["stateDiagram-v2", f"    [*] --> {_S.name.lower()}"]
    for (phase, event), rule in TABLE.items():
        if isinstance(rule, Transition):
            lines += [f"    {phase.name.lower()} --> {to.name.lower()}: {event}" for to in rule.to]
    lines.append(f"    {_X.name.lower()} --> [*]")
    return "\n".join(lines) + "\n"


def render_docstring() -> str:
    """The table of :mod:`.machine`'s docstring: per event, each phase on its own lines."""
    lines: list[str] = []
    for event, words in EVENTS.items():
        lines.append(f"{event} ({words}):")
        for phase in Phase:
            text = f"{phase}: {_cell(TABLE[(phase, event)])}".replace("\\", "\\\\")
            lines += textwrap.wrap(text, 92, initial_indent="  ", subsequent_indent="      ")
    return "\n".join(lines) + "\n"


_BEGIN: Final = "<!-- table: generated by `python -m forgezero_lifecycle.serve.machine --write` -->"
_DIAGRAM_BEGIN: Final = "<!-- diagram: generated by the same -->"
_END: Final = "<!-- end of the generated part -->"
_DOC_BEGIN: Final = "Every (phase, event) pair (rendered from :data:`TABLE`)::\n\n"
_DOC_END: Final = "\nThe invariants"


def _replace(text: str, begin: str, end: str, block: str) -> str:
    head, found, rest = text.partition(begin)
    if not found:
        raise ValueError(f"no {begin!r} marker")
    _, found, tail = rest.partition(end)
    if not found:
        raise ValueError(f"no {end!r} marker after {begin!r}")
    return head + begin + block + end + tail


def rendered(path: Path) -> str:
    """``path`` (the docs page or :mod:`.machine`'s source) with its table rendered anew."""
    text = path.read_text()
    if path.suffix == ".md":
        diagram = f"\n\n```mermaid\n{render_mermaid()}```\n\n"
        text = _replace(text, _DIAGRAM_BEGIN, _END, diagram)
        return _replace(text, _BEGIN, _END, "\n\n" + render_markdown() + "\n")
    indented = textwrap.indent(render_docstring(), "    ")
    return _replace(text, _DOC_BEGIN, _DOC_END, indented)


#: The files whose tables are rendered from :data:`TABLE` (this module's, in the repository).
SOURCES: Final = (
    Path(__file__).with_name("machine.py"),
    Path(__file__).parents[3] / "docs" / "supervisor-states.md",
)


def main(argv: list[str]) -> int:
    """``--write``: render the tables into :data:`SOURCES` (else: print the Markdown one)."""
    if argv != ["--write"]:
        sys.stdout.write(render_markdown())
        return 0
    for path in SOURCES:
        path.write_text(rendered(path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
