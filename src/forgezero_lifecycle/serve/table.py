"""The supervisor's table: every (phase, event) pair, as data.

Each pair is a :class:`Transition` (:class:`~.machine.SupervisorMachine` decides, as the text
says), :class:`Stale` (ignored on purpose: what the event reports is over, for the reason given)
or :class:`Impossible` (no I/O layer can report it there: the machine raises
:class:`ImpossibleEventError` and the supervisor fails loudly). The documented tables, in the
docstring of :mod:`.machine` and in ``docs/supervisor-states.md``, and the state diagram are
rendered from :data:`TABLE` (``python -m forgezero_lifecycle.serve.table --write``);
``tests/serve/test_supervisor_table.py`` fails when either differs from it.
"""

from __future__ import annotations

import enum
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

__all__ = [
    "EVENTS",
    "SOURCES",
    "TABLE",
    "Impossible",
    "ImpossibleEventError",
    "Phase",
    "Rule",
    "Stale",
    "Transition",
    "render_docstring",
    "render_markdown",
    "render_mermaid",
]


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


_BEGIN: Final = "<!-- table: generated by `python -m forgezero_lifecycle.serve.table --write` -->"
_DIAGRAM_BEGIN: Final = "<!-- diagram: generated by the same -->"
_END: Final = "<!-- end of the generated part -->"
_DOC_BEGIN: Final = "Every (phase, event) pair (rendered from :data:`.table.TABLE`)::\n\n"
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
