"""The supervisor's answer to an unauthenticated metrics scrape under ``serve --workers``: one
fan-out to the workers at a time, its merged scrape reused for :data:`METRICS_REUSE` seconds.

Before, every scrape (no token needed) cost a command to every worker and a merge in the
supervisor: 3,000 scrapes took 6 s of its CPU. In-process, on the supervisor's own answering
code (:class:`ForwardedControl`) over stand-in workers that count the scrapes they are asked
for: how many fan-outs a burst of scrapes causes is what this pins, and real workers cannot
report it. tests/serve/test_generation_metrics.py scrapes real workers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from forgezero_lifecycle.core.drain import DrainController
from forgezero_lifecycle.serve.supervisor import METRICS_REUSE, ForwardedControl, HandoverLog
from forgezero_lifecycle.testing import ManualClock

pytestmark = pytest.mark.anyio

EXPOSITION = "# TYPE forgezero_scrapes counter\nforgezero_scrapes_total {count}\n"


class CountingWorker:
    """Answers ``metrics`` after a moment (so scrapes overlap), counting each one."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.pid = 1000 + index
        self.exited = asyncio.Event()
        self.scrapes = 0

    async def command(self, op: str, **fields: Any) -> dict[str, Any]:
        assert op == "metrics"
        self.scrapes += 1
        await asyncio.sleep(0.01)
        return {"text": EXPOSITION.format(count=self.scrapes)}


class StandInGeneration:
    number = 1

    def __init__(self, workers: Sequence[CountingWorker]) -> None:
        self.workers = workers
        self.controller: DrainController | None = None

    def detail(self) -> dict[str, Any]:
        return {}

    async def acknowledged(self) -> None:
        return None


def _control(workers: Sequence[CountingWorker], clock: ManualClock) -> ForwardedControl:
    generation = StandInGeneration(workers)
    return ForwardedControl(
        generation,  # type: ignore[arg-type]  # a stand-in: only its workers are asked
        on_reload=lambda: "not here",
        on_scale=lambda by: "not here",
        status=dict,
        exposition=str,
        handovers=HandoverLog(),
        serving=lambda: None,
        known=tuple,
        clock=clock,
    )


async def test_burst_of_scrapes_fans_out_once() -> None:
    """50 concurrent scrapes ask each worker once and all get the same merged scrape; one more
    within the reuse window asks nobody, one after it asks every worker again."""
    workers = [CountingWorker(0), CountingWorker(1)]
    clock = ManualClock()
    control = _control(workers, clock)
    answers = await asyncio.gather(*(control.answer("metrics", {}) for _ in range(50)))
    assert {answer["status"] for answer in answers} == {200}
    assert len({answer["body"] for answer in answers}) == 1
    assert 'worker="0"' in answers[0]["body"]
    assert 'worker="1"' in answers[0]["body"]
    assert [worker.scrapes for worker in workers] == [1, 1]
    await clock.advance(METRICS_REUSE / 2)
    assert (await control.answer("metrics", {}))["body"] == answers[0]["body"]
    assert [worker.scrapes for worker in workers] == [1, 1]
    await clock.advance(METRICS_REUSE)
    fresh = await control.answer("metrics", {"head": True})
    assert (fresh["status"], fresh["body"]) == (200, "")
    assert [worker.scrapes for worker in workers] == [2, 2]
