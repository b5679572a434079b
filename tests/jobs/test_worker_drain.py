"""JobWorker as the drain's jobs participant: stop claiming, finish, release, roll back."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from forgezero_lifecycle._errors import LeaseLostError
from forgezero_lifecycle.jobs import JobWorker, Lease, MemoryJobStore
from forgezero_lifecycle.testing import ManualClock, settle

from .test_worker import CountingStore, make_worker, until

pytestmark = pytest.mark.anyio


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1000.0)


@pytest.fixture
def store(clock: ManualClock) -> CountingStore:
    return CountingStore(MemoryJobStore(now=clock.monotonic))


class Blocking:
    """A handler that blocks until told to finish; records cancellations."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.cancelled: list[int] = []
        self.finish = asyncio.Event()

    async def __call__(self, lease: Lease[Any]) -> str:
        self.started.append(lease.job.id)
        try:
            await self.finish.wait()
        except asyncio.CancelledError:
            self.cancelled.append(lease.job.id)
            raise
        return "finished"


async def test_pause_stops_claiming(store: CountingStore, clock: ManualClock) -> None:
    """After pause_intake nothing new is claimed; admitted jobs run to completion."""
    worker = make_worker(store, clock, concurrency=2, idle_interval=1.0)
    handler = Blocking()
    worker.handler("q")(handler)
    jobs = [await store.enqueue("q", {"i": i}) for i in range(4)]
    worker.start()
    await until(lambda: len(handler.started) == 2)
    claims_before = len(store.claims)
    worker.pause_intake()
    drain = asyncio.ensure_future(worker.finish(60.0))
    await settle()
    handler.finish.set()
    await drain
    assert len(store.claims) == claims_before
    assert worker.in_flight() == 0
    states = [(await store.get(job.id)).state for job in jobs]
    assert states == ["done", "done", "queued", "queued"]
    await clock.advance(5.0)
    assert len(store.claims) == claims_before  # still paused after the drain
    await worker.stop()


async def test_heartbeats_during_drain(store: CountingStore, clock: ManualClock) -> None:
    """Leases stay alive while a drain waits for long-running jobs."""
    worker = make_worker(store, clock)
    handler = Blocking()
    worker.handler("q")(handler)
    job = await store.enqueue("q", {})
    worker.start()
    await until(lambda: handler.started == [job.id])
    drain = asyncio.ensure_future(worker.finish(120.0))
    await settle()
    for _ in range(6):  # 60 s: twice the lease
        await clock.advance(10.0)
    assert len(store.heartbeats) == 6
    assert await store.inner.reclaim_expired() == 0
    handler.finish.set()
    await drain
    assert (await store.get(job.id)).state == "done"
    await worker.stop()


async def test_deadline_releases_jobs(store: CountingStore, clock: ManualClock) -> None:
    """release_margin before the deadline, running handlers are cancelled and released."""
    worker = make_worker(store, clock, release_margin=2.0)
    handler = Blocking()
    worker.handler("q")(handler)
    jobs = [await store.enqueue("q", {"i": i}) for i in range(2)]
    worker.start()
    await until(lambda: len(handler.started) == 2)
    drain = asyncio.ensure_future(worker.finish(10.0))
    await clock.advance(7.9)
    assert handler.cancelled == []
    assert not drain.done()
    await clock.advance(0.1)
    await drain
    assert sorted(handler.cancelled) == [job.id for job in jobs]
    assert worker.in_flight() == 0
    for job in jobs:
        stored = await store.get(job.id)
        assert (stored.state, stored.attempts, stored.lease_owner) == ("queued", 0, None)
    assert worker.statistics().released == 2
    await worker.stop()


async def test_rollback_resumes_claiming(store: CountingStore, clock: ManualClock) -> None:
    """resume_intake after a drain claims the released and waiting jobs again."""
    worker = make_worker(store, clock, release_margin=1.0)
    handler = Blocking()
    worker.handler("q")(handler)
    job = await store.enqueue("q", {})
    worker.start()
    await until(lambda: handler.started == [job.id])
    drain = asyncio.ensure_future(worker.finish(4.0))
    await clock.advance(4.0)
    await drain
    assert (await store.get(job.id)).state == "queued"
    handler.finish.set()
    worker.resume_intake()
    await until(lambda: worker.statistics().completed == 1)
    assert (await store.get(job.id)).fence == 2
    await worker.stop()


async def test_enqueue_while_draining(store: CountingStore, clock: ManualClock) -> None:
    """Enqueue writes to the store during a drain; the next worker claims it at once."""
    old = make_worker(store, clock)
    old.handler("q")(Blocking())
    old.start()
    old.pause_intake()
    job = await store.enqueue("q", {})
    await settle()
    assert (await store.get(job.id)).state == "queued"
    await old.stop()
    new = JobWorker(store, clock=clock, owner="w2", lease=30.0)
    done: list[int] = []

    @new.handler("q")
    async def handle(lease: Lease[Any]) -> None:
        done.append(lease.job.id)

    new.start()
    await until(lambda: done == [job.id])
    await new.stop()


class GatedClaims(CountingStore):
    """A store whose claim stays in flight until the test opens the gate."""

    def __init__(self, store: MemoryJobStore) -> None:
        super().__init__(store)
        self.gate = asyncio.Event()

    async def claim(self, owner: str, n: int, lease: float, **kw: Any) -> Any:
        leases = await super().claim(owner, n, lease, **kw)
        await self.gate.wait()
        return leases


async def test_racing_claim_released(clock: ManualClock) -> None:
    """Leases from a claim that was in flight at pause time are released, never run."""
    store = GatedClaims(MemoryJobStore(now=clock.monotonic))
    worker = make_worker(store, clock)
    handler = Blocking()
    worker.handler("q")(handler)
    job = await store.enqueue("q", {})
    worker.start()
    await until(lambda: store.claims == [4])
    worker.pause_intake()
    drain = asyncio.ensure_future(worker.finish(30.0))
    await settle()
    assert not drain.done()  # waits for the claim in flight
    store.gate.set()
    await drain
    assert handler.started == []
    stored = await store.get(job.id)
    assert (stored.state, stored.attempts) == ("queued", 0)
    await worker.stop()


async def test_stubborn_handler_fenced(store: CountingStore, clock: ManualClock) -> None:
    """A handler that swallows cancellation still loses its job; its late commit fails."""
    worker = make_worker(store, clock, release_margin=2.0)
    outcome: list[str] = []
    proceed = asyncio.Event()

    @worker.handler("q")
    async def stubborn(lease: Lease[Any]) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            outcome.append("ignored cancel")
        await proceed.wait()
        try:
            async with lease.commit():
                outcome.append("committed")
        except LeaseLostError:
            outcome.append("lease lost")
            raise

    job = await store.enqueue("q", {})
    worker.start()
    await until(lambda: worker.in_flight() == 1)
    drain = asyncio.ensure_future(worker.finish(10.0))
    await clock.advance(8.0)
    await clock.advance(1.0)
    await drain
    assert outcome == ["ignored cancel"]
    stored = await store.get(job.id)
    assert (stored.state, stored.attempts) == ("queued", 0)
    proceed.set()
    await until(lambda: outcome == ["ignored cancel", "lease lost"])
    assert (await store.get(job.id)).state == "queued"
    await worker.stop()


class SlowSweep(CountingStore):
    """A store whose expiry sweep stays in flight until the test opens the gate."""

    def __init__(self, store: MemoryJobStore) -> None:
        super().__init__(store)
        self.gate = asyncio.Event()
        self.sweeping = False

    async def reclaim_expired(self) -> int:
        self.sweeping = True
        await self.gate.wait()
        return await self.inner.reclaim_expired()


async def test_no_claim_starts_after_pause(clock: ManualClock) -> None:
    """A pause that lands while the loop is busy elsewhere (the sweep) prevents the claim."""
    store = SlowSweep(MemoryJobStore(now=clock.monotonic))
    worker = make_worker(store, clock)
    worker.handler("q")(Blocking())
    await store.enqueue("q", {})
    worker.start()
    await until(lambda: store.sweeping)
    worker.pause_intake()
    store.gate.set()
    await settle()
    assert store.claims == []
    await worker.stop()


class StuckRelease(CountingStore):
    """A store whose release waits forever (a completion holding the row lock)."""

    async def release(self, lease: Any) -> None:
        await asyncio.Event().wait()


async def test_drain_ends_by_deadline(clock: ManualClock) -> None:
    """A release stuck behind a lock does not hold the drain past its deadline."""
    store = StuckRelease(MemoryJobStore(now=clock.monotonic))
    worker = make_worker(store, clock, release_margin=2.0)
    handler = Blocking()
    worker.handler("q")(handler)
    await store.enqueue("q", {})
    worker.start()
    await until(lambda: len(handler.started) == 1)
    drain = asyncio.ensure_future(worker.finish(10.0))
    await clock.advance(9.9)
    assert not drain.done()
    await clock.advance(0.1)
    await until(drain.done)
    await worker.stop(timeout=0.0)
