"""JobWorker on the in-memory store with a manual clock: claiming, heartbeats, outcomes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from forgezero_lifecycle._errors import ConfigurationError, JobStateError
from forgezero_lifecycle.core.participant import WorkParticipant
from forgezero_lifecycle.jobs import JobWorker, Lease, MemoryJobStore
from forgezero_lifecycle.testing import ManualClock, settle

pytestmark = pytest.mark.anyio


class CountingStore:
    """Delegates to a MemoryJobStore and records claim and heartbeat calls."""

    def __init__(self, store: MemoryJobStore) -> None:
        self.inner = store
        self.claims: list[int] = []
        self.heartbeats: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def claim(self, owner: str, n: int, lease: float, **kw: Any) -> Any:
        self.claims.append(n)
        return await self.inner.claim(owner, n, lease, **kw)

    async def heartbeat(self, leases: Any, lease: float) -> Any:
        self.heartbeats.append(len(leases))
        return await self.inner.heartbeat(leases, lease)


async def until(predicate: Callable[[], bool], rounds: int = 50) -> None:
    for _ in range(rounds):
        if predicate():
            return
        await settle()
    raise AssertionError("condition not reached")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1000.0)


@pytest.fixture
def store(clock: ManualClock) -> CountingStore:
    return CountingStore(MemoryJobStore(now=clock.monotonic))


def make_worker(store: Any, clock: ManualClock, **kw: Any) -> JobWorker[Any]:
    options: dict[str, Any] = {"concurrency": 4, "lease": 30.0, "heartbeat_every": 10.0}
    options.update(kw)
    return JobWorker(store, clock=clock, owner="w1", **options)


async def test_worker_is_participant(store: CountingStore, clock: ManualClock) -> None:
    """JobWorker satisfies WorkParticipant under the 'jobs' counter."""
    worker = make_worker(store, clock)
    assert isinstance(worker, WorkParticipant)
    assert worker.kind == "jobs"
    assert worker.in_flight() == 0


async def test_runs_and_stores_results(store: CountingStore, clock: ManualClock) -> None:
    """A registered handler runs each job; its return value is the stored result."""
    worker = make_worker(store, clock)

    @worker.handler("double")
    async def double(lease: Lease[Any]) -> int:
        return int(lease.job.payload["n"]) * 2

    jobs = [await store.enqueue("double", {"n": n}) for n in range(3)]
    worker.start()
    await until(lambda: worker.statistics().completed == 3)
    for n, job in enumerate(jobs):
        stored = await store.get(job.id)
        assert stored is not None
        assert (stored.state, stored.result) == ("done", n * 2)
    await worker.stop()


async def test_handler_writes_commit(store: CountingStore, clock: ManualClock) -> None:
    """A handler that opens lease.commit() writes in the completion transaction."""
    worker = make_worker(store, clock)

    @worker.handler("mark")
    async def mark(lease: Lease[Any]) -> None:
        async with lease.commit("ok") as conn:
            conn.put("marks", str(lease.job.id), True)

    job = await store.enqueue("mark", {})
    worker.start()
    await until(lambda: worker.statistics().completed == 1)
    assert store.inner.table("marks") == {str(job.id): True}
    assert (await store.get(job.id)).result == "ok"
    await worker.stop()


async def test_failures_back_off_then_bury(store: CountingStore, clock: ManualClock) -> None:
    """A raising handler is retried after the backoff and is dead after max_attempts."""
    worker = make_worker(store, clock, backoff=lambda attempts: 5.0 * attempts)
    calls: list[int] = []

    @worker.handler("flaky")
    async def flaky(lease: Lease[Any]) -> None:
        calls.append(lease.job.attempts)
        raise RuntimeError("downstream is down")

    job = await store.enqueue("flaky", {}, max_attempts=2)
    worker.start()
    await until(lambda: calls == [1])
    stored = await store.get(job.id)
    assert (stored.state, stored.last_error) == ("queued", "RuntimeError: downstream is down")
    await clock.advance(4.0)
    assert calls == [1]
    await clock.advance(2.0)
    await until(lambda: calls == [1, 2])
    await until(lambda: worker.statistics().failed == 2)
    assert (await store.get(job.id)).state == "dead"
    await worker.stop()


async def test_unknown_queue_unclaimed(store: CountingStore, clock: ManualClock) -> None:
    """A worker claims only queues it has handlers for."""
    worker = make_worker(store, clock)
    job = await store.enqueue("nobody-handles-this", {})
    worker.start()
    await settle()
    assert (await store.get(job.id)).state == "queued"
    await worker.stop()


async def test_enqueue_wakes_idle_loop(store: CountingStore, clock: ManualClock) -> None:
    """An empty claim sleeps idle_interval on the clock; an enqueue here wakes it at once."""
    worker = make_worker(store, clock, idle_interval=5.0)
    done: list[int] = []

    @worker.handler("q")
    async def handle(lease: Lease[Any]) -> None:
        done.append(lease.job.id)

    worker.start()
    await settle(100)
    assert store.claims == [4]  # one claim, then asleep: no busy polling
    await clock.advance(5.0)
    assert store.claims == [4, 4]
    job = await store.enqueue("q", {})
    await until(lambda: done == [job.id])
    await worker.stop()


async def test_claims_sized_to_slots(store: CountingStore, clock: ManualClock) -> None:
    """Each claim asks for exactly the free slots; a full worker does not claim."""
    worker = make_worker(store, clock, concurrency=3)
    gates: dict[int, asyncio.Event] = {}
    open_all = asyncio.Event()

    @worker.handler("q")
    async def handle(lease: Lease[Any]) -> None:
        gates[lease.job.id] = asyncio.Event()
        if not open_all.is_set():
            await gates[lease.job.id].wait()

    for i in range(5):
        await store.enqueue("q", {"i": i})
    worker.start()
    await until(lambda: len(gates) == 3)
    assert store.claims == [3]
    assert worker.in_flight() == 3
    gates[1].set()
    await until(lambda: len(gates) == 4)
    assert store.claims == [3, 1]
    open_all.set()
    for gate in gates.values():
        gate.set()
    await until(lambda: worker.statistics().completed == 5)
    await worker.stop()


async def test_one_heartbeat_call(store: CountingStore, clock: ManualClock) -> None:
    """Every tick extends all held leases in one batched store call."""
    worker = make_worker(store, clock)
    release = asyncio.Event()

    @worker.handler("q")
    async def handle(lease: Lease[Any]) -> None:
        await release.wait()

    jobs = [await store.enqueue("q", {"i": i}) for i in range(3)]
    worker.start()
    await until(lambda: worker.in_flight() == 3)
    await clock.advance(10.0)
    assert store.heartbeats == [3]
    assert (await store.get(jobs[0].id)).lease_until == clock.monotonic() + 30.0
    await clock.advance(50.0)  # beyond the first lease: heartbeats kept it alive
    assert await store.inner.reclaim_expired() == 0
    release.set()
    await until(lambda: worker.statistics().completed == 3)
    await worker.stop()


async def test_lost_lease_cancels(store: CountingStore, clock: ManualClock) -> None:
    """When a heartbeat finds the lease lost, the handler is cancelled and nothing commits."""
    worker = make_worker(store, clock)
    cancelled: list[int] = []
    first_run = asyncio.Event()

    @worker.handler("q")
    async def handle(lease: Lease[Any]) -> None:
        if lease.fence > 1:
            return
        first_run.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(lease.fence)
            raise

    job = await store.enqueue("q", {})
    worker.start()
    await first_run.wait()
    assert await store.inner.release_owner("w1") == 1  # someone else took the job back
    await clock.advance(10.0)
    await until(lambda: cancelled == [1])
    await until(lambda: worker.statistics().completed == 1)
    assert worker.statistics().lost == 1
    stored = await store.get(job.id)
    assert (stored.state, stored.fence) == ("done", 2)
    await worker.stop()


def test_configuration_is_validated(store: CountingStore, clock: ManualClock) -> None:
    """Impossible settings and duplicate handler names raise ConfigurationError."""
    with pytest.raises(ConfigurationError):
        JobWorker(store, concurrency=0)
    with pytest.raises(ConfigurationError):
        JobWorker(store, lease=10.0, heartbeat_every=10.0)
    worker = make_worker(store, clock)

    @worker.handler("q")
    async def one(lease: Lease[Any]) -> None: ...

    with pytest.raises(ConfigurationError):
        worker.handler("q")(one)


async def test_start_once_and_stop_twice(store: CountingStore, clock: ManualClock) -> None:
    """start() twice is an error; stop() is idempotent."""
    worker = make_worker(store, clock)
    worker.start()
    with pytest.raises(JobStateError) as caught:
        worker.start()
    assert caught.value.code == "JOB_STATE_INVALID"
    await worker.stop()
    await worker.stop()
    assert worker.statistics().paused


async def test_sweep_reclaims_expired(store: CountingStore, clock: ManualClock) -> None:
    """The claim loop's sweep requeues another owner's expired lease and runs the job."""
    await store.enqueue("q", {})
    [crashed] = await store.inner.claim("crashed-owner", 1, 5.0)
    worker = make_worker(store, clock, idle_interval=1.0, reclaim_every=2.0)
    ran: list[int] = []

    @worker.handler("q")
    async def handle(lease: Lease[Any]) -> None:
        ran.append(lease.fence)

    worker.start()
    await settle()
    assert ran == []
    await clock.advance(6.0)
    await until(lambda: ran == [2])
    stored = await store.get(crashed.job.id)
    assert (stored.state, stored.attempts) == ("done", 2)
    await worker.stop()


async def test_non_json_result_fails_job(store: CountingStore, clock: ManualClock) -> None:
    """A handler returning a non-JSON value fails its own job; batch neighbours complete."""
    worker = make_worker(store, clock)

    @worker.handler("q")
    async def handle(lease: Lease[Any]) -> object:
        return object() if lease.job.payload["bad"] else "fine"

    bad = await store.enqueue("q", {"bad": True}, max_attempts=1)
    good = [await store.enqueue("q", {"bad": False}) for _ in range(3)]
    worker.start()
    await until(lambda: worker.statistics().completed == 3)
    await until(lambda: worker.statistics().failed == 1)
    dead = await store.get(bad.id)
    assert dead.state == "dead"
    assert dead.last_error.startswith("JobInvalidError: JOB_INVALID")
    for job in good:
        assert (await store.get(job.id)).result == "fine"
    await worker.stop()


class HeartbeatBreaksClock:
    """A manual clock whose sleep of ``broken`` seconds raises: one loop crashes, not the other."""

    def __init__(self, clock: ManualClock, broken: float) -> None:
        self.clock = clock
        self.broken = broken

    def monotonic(self) -> float:
        return self.clock.monotonic()

    async def sleep(self, seconds: float) -> None:
        if seconds == self.broken:
            raise RuntimeError("the heartbeat's clock broke")
        await self.clock.sleep(seconds)


async def test_crashed_loop_recorded(store: CountingStore, clock: ManualClock) -> None:
    """The worker's loops share one group: a crash cancels the other loop and is recorded."""
    before = asyncio.all_tasks()
    broken = HeartbeatBreaksClock(clock, broken=10.0)
    worker = JobWorker(store, clock=broken, owner="w1", lease=30.0, heartbeat_every=10.0)
    worker.start()
    await until(lambda: worker.statistics().last_error is not None)
    await settle()
    assert worker.statistics().last_error == "RuntimeError: the heartbeat's clock broke"
    left = {task.get_name() for task in asyncio.all_tasks() - before}
    assert not any(name.startswith("forgezero-jobs-claim") for name in left)
    await worker.stop(timeout=1.0)


async def test_drain_is_deprecated(store: CountingStore, clock: ManualClock) -> None:
    """``JobWorker.drain(timeout)`` still finishes the worker's jobs, and warns."""
    worker = make_worker(store, clock)
    with pytest.warns(DeprecationWarning, match=r"call finish\(timeout\)"):
        await worker.drain(1.0)
    assert worker.statistics().paused
