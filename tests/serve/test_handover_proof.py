"""A handover proves its new generation serves before it retires the old one.

Machine level: the old generation stops accepting only once the new one's proof is in; a proof
not in time abandons the handover (the new workers hand their clients back and drain on their
own bound, the old generation is untouched). Real processes (``tests/serve/proof_app.py``): the
new generation's workers block their event loop right after they begin to accept; requests sent
meanwhile are answered by the old generation, and the handover waits for the new one (or, past
the start timeout, is abandoned with ``RUNTIME_HANDOVER_NOT_PROVED``).
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import httpx
import pytest

from forgezero_lifecycle.serve import machine as m

from .conftest import AUTH, StartSupervised, Supervised

APP: Final = "tests.serve.proof_app:app"
CLIENTS: Final = 3
#: A request sent this long before the new workers' blocks (4 s and 14 s) ended, and answered
#: after them, is taken to have waited for the blocked generation. On a loaded machine an old
#: worker's own answer can take most of a second (0.84 s seen under `make test-pythons`, 3.13,
#: when the margin was 0.5 s), so the margin is 2 s.
WAITED_MARGIN: Final = 2.0


def _serving(workers: int = 2) -> m.SupervisorMachine:
    machine = m.SupervisorMachine(workers)
    machine.start()
    for index in range(workers):
        machine.handle(m.WorkerReady(1, index))
    return machine


def _proving(machine: m.SupervisorMachine) -> list[m.Action]:
    machine.handle(m.Reload())
    actions: list[m.Action] = []
    for index in range(2):
        actions += machine.handle(m.WorkerReady(2, index))
    return actions


def test_old_generation_accepts_until_the_proof() -> None:
    """n accepts and is proved; g stops accepting only once the proof is in."""
    machine = _serving()
    actions = _proving(machine)
    assert actions == [m.Accept(2, (0, 1), whole=True), m.Prove(2, (0, 1))]
    assert machine.current == 1
    assert machine.handle(m.ProofSettled(2, proved=True)) == [m.StopAccepting(1), m.StartGrace(1)]
    assert machine.current == 2
    assert machine.handle(m.ProofSettled(2, proved=True)) == []  # in already


def test_proof_not_in_time_abandons_the_handover() -> None:
    """Not proved: n's workers hand their clients back and drain alone; g serves untouched;
    the handover ends, aborted, once n's workers are gone; a stop then drains g alone."""
    machine = _serving()
    _proving(machine)
    why = "worker 1 did not answer"
    actions = machine.handle(m.ProofSettled(2, proved=False, why=why))
    (stop,) = actions
    assert isinstance(stop, m.StopWorkers)
    assert (stop.generation, stop.indexes, stop.hand_over, stop.short) == (2, (0, 1), True, False)
    assert machine.phase is m.Phase.SERVING
    assert machine.current == 1
    assert machine.generation_state(1) is m.GenerationState.SERVING
    machine.handle(m.WorkerExited(2, 0))
    ended = m.HandoverEnded(
        1, False, f"generation 2 did not prove it serves: {why}", "RUNTIME_HANDOVER_NOT_PROVED"
    )
    assert ended in machine.handle(m.WorkerExited(2, 1))
    assert machine.generations() == [1]
    assert m.BeginDrain(1) in machine.handle(m.StopSignal())


def test_stop_during_abandoned_handover_drains_the_old_generation() -> None:
    """A stop while an abandoned n's workers still drain alone: g is drained, n is waited for
    (not drained by the stop), and the exit is 0 once g drained and everyone is gone."""
    machine = _serving()
    _proving(machine)
    machine.handle(m.ProofSettled(2, proved=False, why="not proved"))
    actions = machine.handle(m.StopSignal())
    assert [a for a in actions if isinstance(a, m.BeginDrain)] == [m.BeginDrain(1)]
    machine.handle(m.DrainSettled(1, drained=True))
    machine.handle(m.QueueEmptied())
    for index in range(2):
        machine.handle(m.WorkerExited(2, index))
    actions = machine.handle(m.WorkerExited(1, 0))
    actions += machine.handle(m.WorkerExited(1, 1))
    assert m.Exit(0, "drained") in actions


# Real processes.


@dataclass(frozen=True)
class Answer:
    sent: float
    answered: float
    status: int
    pid: int


class Clients:
    """Requests on new connections, sent one after the other by each of a few threads."""

    def __init__(self, served: Supervised) -> None:
        self.served = served
        self.answers: list[Answer] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run) for _ in range(CLIENTS)]

    def __enter__(self) -> Clients:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                response = self.served.get("/")
            except httpx.HTTPError as error:
                self.errors.append(f"{type(error).__name__}: {error}")
                continue
            pid = int(response.text) if response.status_code == 200 else 0
            self.answers.append(Answer(sent, time.monotonic(), response.status_code, pid))


def _blocks(block_file: Path) -> dict[int, tuple[float, float]]:
    """Each blocked worker's PID → the monotonic times its block began and ended."""
    found = {}
    for path in block_file.parent.glob(f"{block_file.name}.*"):
        began, ended = map(float, path.read_text().split())
        found[int(path.suffix[1:])] = (began, ended)
    return found


def _check_old_answered_during_blocks(
    clients: Clients, old: set[int], blocks: dict[int, tuple[float, float]]
) -> None:
    """Nothing lost or refused; a request sent while the new workers were blocked was answered
    by the old generation before the blocks ended (it did not wait for the new one)."""
    assert clients.errors == []
    assert {answer.status for answer in clients.answers} == {200}
    began = max(start for start, _ in blocks.values())
    ended = min(end for _, end in blocks.values())
    during = [a for a in clients.answers if began <= a.sent < ended - WAITED_MARGIN]
    assert during, "no request was sent while the new generation was blocked"
    late = [a for a in during if a.answered >= ended or a.pid not in old]
    assert late == [], f"{len(late)} of {len(during)} requests waited for the blocked generation"


@pytest.mark.timeout(120)
def test_handover_waits_until_new_generation_answers(
    start_supervised: StartSupervised, tmp_path: Path
) -> None:
    """The new generation's event loops block for 4 s right after their accept: the old one
    serves every request meanwhile, and the handover is done only after the new one answered."""
    block_file = tmp_path / "block"
    served = start_supervised(
        "--start-timeout", "30s", target=APP, env={"FZP_BLOCK_FILE": str(block_file)}
    )
    old = set(served.workers())
    block_file.write_text("4")
    with Clients(served) as clients:
        served.wait_for(lambda: len(clients.answers) > 10, "answers before the handover")
        served.signal(signal.SIGHUP)
        served.wait_log("supervisor.handover_done from=1 to=2")
        blocks = _blocks(block_file)
        assert len(blocks) == 2, f"the new workers' blocks had not ended: {blocks}\n{served.log()}"
        served.wait_for(lambda: len(served.workers()) == 2, "the old generation gone")
    assert set(served.workers()).isdisjoint(old)
    assert "supervisor.new_generation_ready generation=2" in served.log()
    _check_old_answered_during_blocks(clients, old, blocks)
    served.signal(signal.SIGTERM)
    assert served.wait_exit() == 0, served.log()


@pytest.mark.timeout(120)
def test_handover_not_proved_within_start_timeout_is_abandoned(
    start_supervised: StartSupervised, tmp_path: Path
) -> None:
    """The new generation blocks longer than the start timeout: the handover is abandoned
    (``RUNTIME_HANDOVER_NOT_PROVED``), the old generation serves on throughout, the new one
    hands back and stops; a stop afterwards drains the old one: exit 0."""
    block_file = tmp_path / "block"
    served = start_supervised(
        "--start-timeout", "10s", target=APP, env={"FZP_BLOCK_FILE": str(block_file)}
    )
    old = set(served.workers())
    block_file.write_text("14")  # past the start timeout (a loaded machine needs it to start)
    with Clients(served) as clients:
        served.wait_for(lambda: len(clients.answers) > 10, "answers before the handover")
        served.signal(signal.SIGHUP)
        served.wait_log("supervisor.handover_aborted")
        served.wait_for(lambda: len(_blocks(block_file)) == 2, "the new workers' blocks ended")
        served.wait_for(lambda: set(served.workers()) == old, "the new generation gone")
    handover = served.get("/.forgezero/runtime/supervisor/v1/handover", headers=AUTH).json()
    assert (handover["state"], handover["failure"]) == ("aborted", "RUNTIME_HANDOVER_NOT_PROVED")
    assert handover["detail"].startswith("generation 2 did not prove it serves: ")
    log = served.log()
    assert "supervisor.proof_failed generation=2: RUNTIME_HANDOVER_NOT_PROVED" in log
    assert "supervisor.handover_done" not in log
    assert "stopped_accepting" not in log.split("supervisor.proof_failed")[0]
    _check_old_answered_during_blocks(clients, old, _blocks(block_file))
    served.signal(signal.SIGTERM)
    assert served.wait_exit() == 0, served.log()
