"""The supervisor's table (:data:`~forgezero_lifecycle.serve.machine.TABLE`) is the code: every
(phase, event) pair is decided there, the machine obeys it, and the documented tables are
rendered from it."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from forgezero_lifecycle.serve import machine as m

EVENTS: dict[str, m.Event] = {
    "Reload": m.Reload(),
    "StopSignal": m.StopSignal(),
    "WorkerReady": m.WorkerReady(1, 0),
    "WorkerExited": m.WorkerExited(1, 0),
    "StartTimeout": m.StartTimeout(1, 0),
    "StartFailed": m.StartFailed(2, "the revision could not be read"),
    "ReplaceDue": m.ReplaceDue(1, 0, 0),
    "GraceOver": m.GraceOver(1),
    "ProofSettled": m.ProofSettled(2, proved=True),
    "DrainBegun": m.DrainBegun(1),
    "DrainRolledBack": m.DrainRolledBack(1),
    "DrainSettled": m.DrainSettled(1, drained=True),
    "StateHanded": m.StateHanded(2),
    "QueueEmptied": m.QueueEmptied(),
    "StopTimeout": m.StopTimeout(1, 1),
    "LimitReached": m.LimitReached(1, 0, "max-requests"),
    "WorkerUnresponsive": m.WorkerUnresponsive(1, 0),
    "Scale": m.Scale(1),
}


def _starting() -> m.SupervisorMachine:
    machine = m.SupervisorMachine(2)
    machine.start()
    return machine


def _serving() -> m.SupervisorMachine:
    machine = _starting()
    for index in range(2):
        machine.handle(m.WorkerReady(1, index))
    return machine


def _handing_over() -> m.SupervisorMachine:
    machine = _serving()
    machine.handle(m.Reload())
    return machine


def _stopping() -> m.SupervisorMachine:
    machine = _serving()
    machine.handle(m.StopSignal())
    return machine


def _stopped() -> m.SupervisorMachine:
    machine = _starting()
    machine.handle(m.StopSignal())
    for index in range(2):
        machine.handle(m.WorkerExited(1, index))
    return machine


IN: dict[m.Phase, Callable[[], m.SupervisorMachine]] = {
    m.Phase.STARTING: _starting,
    m.Phase.SERVING: _serving,
    m.Phase.HANDING_OVER: _handing_over,
    m.Phase.STOPPING: _stopping,
    m.Phase.STOPPED: _stopped,
}


def test_every_pair_is_in_the_table() -> None:
    """One rule for each phase and each event the machine takes, and nothing else."""
    names = {event.__name__ for event in m.Event.__args__}
    assert set(m.EVENTS) == names == set(EVENTS)
    assert set(m.TABLE) == {(phase, name) for phase in m.Phase for name in names}


@pytest.mark.parametrize(("phase", "event"), sorted(m.TABLE))
def test_machine_obeys_its_table(phase: m.Phase, event: str) -> None:
    """Impossible raises; stale changes nothing and answers nothing; a transition moves the
    phase only where the table says."""
    machine = IN[phase]()
    assert machine.phase is phase
    rule = m.TABLE[(phase, event)]
    before = copy.deepcopy(vars(machine))
    match rule:
        case m.Impossible():
            with pytest.raises(m.ImpossibleEventError, match=event):
                machine.handle(EVENTS[event])
        case m.Stale():
            assert machine.handle(EVENTS[event]) == []
            assert vars(machine) == before
        case m.Transition(to=to):
            machine.handle(EVENTS[event])
            assert machine.phase in (phase, *to)


@pytest.mark.parametrize("path", m.SOURCES, ids=lambda path: path.name)
def test_documented_tables_are_rendered_from_the_code(path: object) -> None:
    """The docs page and the machine's docstring hold the table as the code has it (render
    them anew with ``python -m forgezero_lifecycle.serve.machine --write``)."""
    assert isinstance(path, type(m.SOURCES[0]))
    assert path.read_text() == m.rendered(path), f"{path} differs from serve.machine.TABLE"
