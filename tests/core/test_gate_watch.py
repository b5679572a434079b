"""IntakeGate.watch: each drain moment reaches the watchers inside the call that begins it."""

from __future__ import annotations

import pytest

from forgezero_lifecycle.core.gate import DrainMoment, IntakeGate

pytestmark = pytest.mark.anyio


async def test_each_moment_is_told_once_per_drain_in_order() -> None:
    """draining once (begin_draining then close), then notice, then cutoff; again after reopen.
    No await in between: each watcher has run before the call returns."""
    gate = IntakeGate()
    told: list[tuple[DrainMoment, bool, bool]] = []
    gate.watch(lambda moment: told.append((moment, gate.draining, gate.notice.is_set())))

    gate.begin_draining()
    gate.close()
    gate.end_streams()
    gate.cut_off()
    gate.reopen()
    gate.close()

    assert told == [
        ("draining", True, False),
        ("notice", True, True),
        ("cutoff", True, True),
        ("draining", True, False),
    ]
