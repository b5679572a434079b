"""DrainSteps: where a drain came from, and the drain's work owned by the drain."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from forgezero_lifecycle._errors import DrainConflictError
from forgezero_lifecycle.core.gate import IntakeGate
from forgezero_lifecycle.core.participant import ParticipantKind, WorkParticipant
from forgezero_lifecycle.core.steps import DrainSteps
from forgezero_lifecycle.testing import ManualClock, settle

pytestmark = pytest.mark.anyio

NONCE = "S" * 43


def request(timeout_ms: int = 10_000) -> dict[str, Any]:
    return {
        "protocol": "forgezero-drain/v1",
        "nonce": NONCE,
        "sourceRevision": "0" * 40,
        "targetRevision": "f" * 40,
        "timeoutMs": timeout_ms,
    }


def steps(
    participants: list[WorkParticipant] | None = None,
    *,
    supervised: bool = False,
    not_ready_grace: float = 0.0,
    siblings: tuple[int, ...] = (),
) -> DrainSteps:
    return DrainSteps(
        IntakeGate(),
        participants or [],
        clock=ManualClock(),
        revision=None,
        not_ready_grace=not_ready_grace,
        stream_grace=5.0,
        supervised=lambda: supervised,
        siblings=lambda: siblings,
    )


class BrokenParticipant:
    kind: ParticipantKind = "jobs"

    def in_flight(self) -> int:
        return 0

    def pause_intake(self) -> None:
        pass

    async def finish(self, timeout: float) -> None:
        raise OSError("the job store is gone")

    def resume_intake(self) -> None:
        pass


def tasks_but(before: set[asyncio.Task[Any]]) -> set[asyncio.Task[Any]]:
    return asyncio.all_tasks() - before


async def test_sibling_workers_refused() -> None:
    """A drain request reaches one of several workers on a socket: refused before the gate or
    the controller changes, with the way to drain them all."""
    found = steps(siblings=(4242,))
    with pytest.raises(DrainConflictError) as refused:
        found.controller.begin(request(), origin="control")
    assert refused.value.code == "RUNTIME_DRAIN_SHARED_LISTENER"
    detail = refused.value.detail or ""
    assert "4242" in detail
    assert "serve APP --workers N" in detail
    assert "forgezero_lifecycle.gunicorn.UvicornWorker" in detail
    assert found.controller.state is None
    assert not found.controller.active
    assert not found.intake_closed


async def test_signal_drain_with_siblings() -> None:
    """A signal reaches every worker, so each drains itself whatever its siblings."""
    drain = steps(siblings=(4242,)).controller
    drain.begin(request(), origin="signal")
    assert await drain.wait() == "drained"


async def test_supervised_skips_siblings() -> None:
    """Under the supervisor every worker is drained as one generation."""
    drain = steps(supervised=True, siblings=(4242,)).controller
    drain.begin(request(), origin="control")
    assert await drain.wait() == "drained"


async def test_failing_step_cancels_other() -> None:
    """A participant that raises fails the drain; the wait for requests does not run on."""
    before = asyncio.all_tasks()
    gate = IntakeGate()
    drain_steps = DrainSteps(
        gate,
        [BrokenParticipant()],
        clock=ManualClock(),
        revision=None,
        not_ready_grace=0.0,
        stream_grace=5.0,
        supervised=lambda: True,
    )
    assert gate.admit_http()  # a request that never ends keeps the wait for requests going
    drain_steps.controller.begin(request())
    assert await drain_steps.controller.wait() == "failed"
    await settle()
    assert tasks_but(before) == set()
    gate.release_http()


async def test_early_rollback_no_task() -> None:
    """Rolled back before its work ran, the drain leaves nothing running and intake open."""
    before = asyncio.all_tasks()
    drain_steps = steps(not_ready_grace=1.0)
    drain_steps.controller.begin(request())
    drain_steps.controller.rollback(NONCE)
    await settle()
    assert tasks_but(before) == set()
    assert not drain_steps.intake_closed


class OldParticipant:
    """A participant written against the old name of ``finish``."""

    kind: ParticipantKind = "jobs"

    def __init__(self) -> None:
        self.finished: list[float] = []

    def in_flight(self) -> int:
        return 0

    def pause_intake(self) -> None:
        pass

    async def drain(self, timeout: float) -> None:
        self.finished.append(timeout)

    def resume_intake(self) -> None:
        pass


async def test_old_method_name_works() -> None:
    """``drain(timeout)`` before it was ``finish``: added with a warning, and called."""
    from forgezero_lifecycle.runtime import Runtime

    runtime = Runtime(insecure_loopback_control=True, clock=ManualClock())
    old = OldParticipant()
    with pytest.warns(DeprecationWarning, match=r"now names this method finish\(timeout\)"):
        # An old-style participant on purpose: add() must still take it, with a warning.
        assert runtime.add(old) is old  # type: ignore[type-var]
    runtime.drain.begin(request(), origin="signal")
    assert await runtime.drain.wait() == "drained"
    assert len(old.finished) == 1
