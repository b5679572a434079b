"""IntakeGate.watch: each drain moment reaches the watchers inside the call that begins it."""

from __future__ import annotations

import pytest

from forgezero_lifecycle.core.gate import DrainMoment, IntakeGate

pytestmark = pytest.mark.anyio


async def test_moments_told_once_in_order() -> None:
    """draining once (begin_draining then close), closed once (a second close tells nothing),
    then notice, then cutoff; again after reopen. No await in between: each watcher has run
    before the call returns."""
    gate = IntakeGate()
    told: list[tuple[DrainMoment, bool, bool]] = []
    gate.watch(lambda moment: told.append((moment, gate.draining, gate.notice.is_set())))

    gate.begin_draining()
    gate.close()
    gate.close()
    gate.end_streams()
    gate.cut_off()
    gate.reopen()
    gate.close()

    assert told == [
        ("draining", True, False),
        ("closed", True, False),
        ("notice", True, True),
        ("cutoff", True, True),
        ("draining", True, False),
        ("closed", True, False),
    ]
