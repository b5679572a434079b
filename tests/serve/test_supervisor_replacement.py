"""Replacing one worker while its generation serves on (recycling, the watchdog, scaling), as the
supervisor's machine decides it (``serve.machine``): the new worker accepts before the old one
stops accepting, one replacement at a time, never during a handover or a stop."""

from __future__ import annotations

from forgezero_lifecycle.serve import machine as m


def _serving(workers: int = 2) -> m.SupervisorMachine:
    machine = m.SupervisorMachine(workers)
    machine.start()
    for index in range(workers):
        machine.handle(m.WorkerReady(1, index))
    assert machine.phase is m.Phase.SERVING
    return machine


def _of(kind: type, actions: list[m.Action]) -> list[m.Action]:
    return [action for action in actions if isinstance(action, kind)]


def test_recycled_worker_stops_accepting_only_after_its_replacement_accepts() -> None:
    """A worker past its limit: its replacement starts in a new place; once that accepts, the
    old one hands its clients over and drains under the full bound, and is not replaced."""
    machine = _serving()
    began = machine.handle(m.LimitReached(1, 0, "max-requests: 400 requests"))
    assert began == [
        m.ReplacementBegun(1, 2, 0, "recycle", "max-requests: 400 requests"),
        m.StartWorker(1, 2),
    ]
    accept, stop, ended = machine.handle(m.WorkerReady(1, 2))
    assert accept == m.Accept(1, (2,))
    assert isinstance(stop, m.StopWorkers)
    assert (stop.indexes, stop.hand_over, stop.short) == ((0,), True, False)
    assert ended == m.ReplacementEnded(1, 2, 0, "recycle", done=True)
    assert machine.handle(m.WorkerExited(1, 0)) == []  # left for good: no replacement
    assert machine.worker_states(1) == (
        m.WorkerState.EXITED,
        m.WorkerState.ACCEPTING,
        m.WorkerState.ACCEPTING,
    )


def test_recycling_reuses_a_free_place() -> None:
    """The place of a worker that left is taken by the next replacement: places stay few."""
    machine = _serving()
    machine.handle(m.LimitReached(1, 0, "max-requests"))
    machine.handle(m.WorkerReady(1, 2))
    machine.handle(m.WorkerExited(1, 0))
    began = machine.handle(m.LimitReached(1, 1, "max-requests"))
    assert m.StartWorker(1, 0) in began


def test_one_replacement_at_a_time() -> None:
    """Two workers due at once: the second replacement begins in the step the first one's
    new worker accepts."""
    machine = _serving()
    assert _of(m.StartWorker, machine.handle(m.LimitReached(1, 0, "max-requests")))
    assert machine.handle(m.LimitReached(1, 1, "max-requests")) == []
    actions = machine.handle(m.WorkerReady(1, 2))
    assert _of(m.StartWorker, actions) == [m.StartWorker(1, 3)]
    assert actions.index(m.Accept(1, (2,))) < actions.index(m.StartWorker(1, 3))


def test_recycling_pauses_during_a_handover() -> None:
    """A worker of the new generation due during the handover is replaced once it is done; a
    worker of the old generation never is (the handover replaces it)."""
    machine = _serving()
    machine.handle(m.Reload())
    machine.handle(m.WorkerReady(2, 0))
    machine.handle(m.WorkerReady(2, 1))  # n accepts
    machine.handle(m.ProofSettled(2, proved=True))  # n serves, g stops accepting
    assert machine.handle(m.LimitReached(2, 1, "max-requests")) == []
    assert machine.handle(m.LimitReached(1, 0, "max-requests")) == []
    machine.handle(m.GraceOver(1))
    machine.handle(m.DrainSettled(1, drained=True))
    machine.handle(m.WorkerExited(1, 0))
    done = machine.handle(m.WorkerExited(1, 1))
    assert machine.phase is m.Phase.SERVING
    assert _of(m.ReplacementBegun, done) == [m.ReplacementBegun(2, 2, 1, "recycle", "max-requests")]


def test_reload_gives_up_the_replacement_running() -> None:
    """A handover begun while a replacement starts: the new worker stops (it never accepted)."""
    machine = _serving()
    machine.handle(m.LimitReached(1, 0, "max-requests"))
    actions = machine.handle(m.Reload())
    (stop,) = _of(m.StopWorkers, actions)
    assert (stop.generation, stop.indexes, stop.short) == (1, (2,), True)
    (ended,) = _of(m.ReplacementEnded, actions)
    assert not ended.done
    assert m.StartGeneration(2, 2) in actions
    assert machine.handle(m.WorkerExited(1, 2)) == []


def test_stop_during_a_replacement_drains_the_generation() -> None:
    """A stop while a recycled worker hands over: the new worker still starting stops at
    once, the generation drains, the worker handing over drains on its own; exit 0."""
    machine = _serving()
    machine.handle(m.LimitReached(1, 0, "max-requests"))
    machine.handle(m.WorkerReady(1, 2))
    machine.handle(m.LimitReached(1, 1, "max-requests"))  # its replacement, place 3, starts
    actions = machine.handle(m.StopSignal())
    assert m.BeginDrain(1) in actions
    assert [(s.indexes, s.short) for s in _of(m.StopWorkers, actions)] == [((3,), True)]
    assert _of(m.ReplacementEnded, actions)[0].done is False
    machine.handle(m.WorkerExited(1, 3))
    machine.handle(m.WorkerExited(1, 0))
    assert machine.handle(m.DrainSettled(1, drained=True)) == [m.EmptyQueue()]
    (stop,) = _of(m.StopWorkers, machine.handle(m.QueueEmptied()))
    assert stop.indexes == (1, 2)
    machine.handle(m.WorkerExited(1, 1))
    assert machine.handle(m.WorkerExited(1, 2)) == [m.Forget(1), m.Exit(0, "drained")]


def test_unresponsive_worker_is_killed_once_its_replacement_accepts() -> None:
    """The watchdog: the replacement first, then the kill (before any recycling due)."""
    machine = _serving()
    machine.handle(m.LimitReached(1, 1, "max-requests"))  # its replacement starts: place 2
    assert machine.handle(m.WorkerUnresponsive(1, 0, "no answer in 2 s")) == []
    after = machine.handle(m.WorkerReady(1, 2))
    assert _of(m.ReplacementBegun, after) == [
        m.ReplacementBegun(1, 3, 0, "unresponsive", "no answer in 2 s")
    ]
    actions = machine.handle(m.WorkerReady(1, 3))
    assert actions[:2] == [m.Accept(1, (3,)), m.Kill(1, (0,), unresponsive=True)]
    assert machine.handle(m.WorkerExited(1, 0)) == []


def test_unresponsive_worker_whose_replacement_fails_is_killed_and_replaced() -> None:
    """Its replacement does not start: the unresponsive worker is killed now and replaced as
    any lost worker is."""
    machine = _serving()
    machine.handle(m.WorkerUnresponsive(1, 0, "no answer"))
    actions = machine.handle(m.WorkerExited(1, 2, "exit code 1"))
    assert m.Kill(1, (0,), unresponsive=True) in actions
    assert not _of(m.ReplacementEnded, actions)[0].done
    replace = machine.handle(m.WorkerExited(1, 0))
    assert _of(m.ScheduleReplacement, replace)


def test_unresponsive_during_a_handover_is_killed_now() -> None:
    """During a handover an unresponsive worker is killed at once: the handover replaces it."""
    machine = _serving()
    machine.handle(m.Reload())
    assert machine.handle(m.WorkerUnresponsive(1, 1)) == [m.Kill(1, (1,), unresponsive=True)]


def test_scale_up_then_down() -> None:
    """SIGTTIN adds a worker (it accepts once ready); SIGTTOU removes the last that accepts,
    which hands its clients over and drains."""
    machine = _serving()
    up = machine.handle(m.Scale(1))
    assert up[0] == m.Scaled(3, 1)
    assert m.StartWorker(1, 2) in up
    assert _of(m.Accept, machine.handle(m.WorkerReady(1, 2))) == [m.Accept(1, (2,))]
    down = machine.handle(m.Scale(-1))
    (stop,) = _of(m.StopWorkers, down)
    assert (stop.indexes, stop.hand_over) == ((2,), True)
    assert machine.handle(m.WorkerExited(1, 2)) == []
    assert machine.size == 2


def test_never_below_one_worker() -> None:
    """The last worker stays: scaling below one is refused."""
    machine = _serving(1)
    assert machine.handle(m.Scale(-1)) == [
        m.Refused("a generation has 1 to 64 workers; it has 1", "scale")
    ]


def test_scale_refused_during_a_handover_and_the_next_generation_has_the_new_size() -> None:
    """Scaling waits for the handover; a handover starts as many workers as the size says."""
    machine = _serving()
    machine.handle(m.Scale(1))
    machine.handle(m.WorkerReady(1, 2))
    reload = machine.handle(m.Reload())
    assert m.StartGeneration(2, 3) in reload
    (refused,) = machine.handle(m.Scale(1))
    assert isinstance(refused, m.Refused)
    assert refused.what == "scale"


def test_added_worker_that_fails_to_start_is_not_wanted_any_more() -> None:
    """A worker added by scaling that exits before it is ready: the size goes back."""
    machine = _serving()
    machine.handle(m.Scale(1))
    actions = machine.handle(m.WorkerExited(1, 2, "exit code 1"))
    assert not _of(m.ReplacementEnded, actions)[0].done
    assert machine.size == 2
    assert not _of(m.StartWorker, actions)
