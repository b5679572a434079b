"""JobWorker against every store with the real clock (short leases, bounded waits)."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

from forgezero_lifecycle.jobs import JobStatistics, JobWorker, Lease

from .conftest import StoreKit

pytestmark = pytest.mark.anyio


async def wait_for_stats(kit: StoreKit, expected: JobStatistics, seconds: float = 15.0) -> None:
    with anyio.fail_after(seconds):
        while await kit.store.statistics() != expected:  # noqa: ASYNC110 - database state
            await anyio.sleep(0.02)


async def test_burn_down_exactly_once(kit: StoreKit) -> None:
    """Jobs with and without handler writes all complete, each exactly once."""
    worker = JobWorker(kit.store, concurrency=8, lease=2.0, idle_interval=0.05, owner="w")
    runs: list[int] = []

    @worker.handler("write")
    async def write(lease: Lease[Any]) -> None:
        runs.append(lease.job.id)
        async with lease.commit({"wrote": True}) as conn:
            await kit.mark(conn, f"job-{lease.job.id}")

    @worker.handler("noop")
    async def noop(lease: Lease[Any]) -> int:
        runs.append(lease.job.id)
        return lease.job.id

    jobs = [await kit.store.enqueue("write" if i % 2 else "noop", {"i": i}) for i in range(40)]
    worker.start()
    try:
        await wait_for_stats(kit, JobStatistics(done=40))
    finally:
        await worker.stop(timeout=2.0)
    assert sorted(runs) == sorted(job.id for job in jobs)
    for job in jobs:
        stored = await kit.store.get(job.id)
        assert stored is not None
        assert stored.attempts == 1
        if job.queue == "write":
            assert stored.result == {"wrote": True}
            assert await kit.marked(f"job-{job.id}")
        else:
            assert stored.result == job.id
    assert worker.statistics().completed == 40


async def test_drain_releases_unfinished(kit: StoreKit) -> None:
    """Near the deadline running jobs are released; a new worker claims them at once."""
    old = JobWorker(kit.store, concurrency=4, lease=30.0, owner="old", release_margin=0.4)
    started = asyncio.Event()

    @old.handler("q")
    async def hang(lease: Lease[Any]) -> None:
        started.set()
        await asyncio.Event().wait()

    for i in range(3):
        await kit.store.enqueue("q", {"i": i})
    old.start()
    with anyio.fail_after(5):
        await started.wait()
        while old.in_flight() < 3:  # noqa: ASYNC110 - counts from another task group
            await anyio.sleep(0.01)
    with anyio.fail_after(5):
        await old.finish(1.2)
    assert old.in_flight() == 0
    assert await kit.store.statistics() == JobStatistics(queued=3)
    await old.stop(timeout=0.5)

    new = JobWorker(kit.store, concurrency=4, lease=30.0, owner="new", idle_interval=0.05)

    @new.handler("q")
    async def finish(lease: Lease[Any]) -> None:
        assert lease.job.attempts == 1
        assert lease.fence == 2

    new.start()
    try:
        await wait_for_stats(kit, JobStatistics(done=3), seconds=5.0)  # far below the 30 s lease
    finally:
        await new.stop(timeout=1.0)
