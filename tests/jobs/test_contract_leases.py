"""JobStore contract, part 2: fencing, heartbeats, completion, failure, release, expiry."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from forgezero_lifecycle._errors import LeaseLostError
from forgezero_lifecycle.jobs import Lease

from .conftest import StoreKit

pytestmark = pytest.mark.anyio


async def _stale_and_current(kit: StoreKit) -> tuple[Lease[object], Lease[object]]:
    """A lease that expired and was reclaimed, and the new generation's lease on the job."""
    await kit.store.enqueue("q", {"n": 1})
    [stale] = await kit.store.claim("old", 1, 0.2)
    await anyio.sleep(0.4)
    assert await kit.store.reclaim_expired() == 1
    [current] = await kit.store.claim("new", 1, 30.0)
    assert current.job.id == stale.job.id
    assert current.fence == stale.fence + 1
    return stale, current


async def test_complete_commits_writes(kit: StoreKit) -> None:
    """The handler's writes and the completion commit together; the result is stored."""
    job = await kit.store.enqueue("q", {})
    [lease] = await kit.store.claim("w", 1, 30.0)
    async with lease.commit({"sent": True}) as conn:
        await kit.mark(conn, "done-1")
    assert lease.settled
    stored = await kit.store.get(job.id)
    assert stored is not None
    assert (stored.state, stored.result, stored.lease_owner) == ("done", {"sent": True}, None)
    assert await kit.marked("done-1")


async def test_store_complete_context(kit: StoreKit) -> None:
    """store.complete(lease) is the same transaction as lease.commit()."""
    job = await kit.store.enqueue("q", {})
    [lease] = await kit.store.claim("w", 1, 30.0)
    async with kit.store.complete(lease, 7) as conn:
        await kit.mark(conn, "via-store")
    stored = await kit.store.get(job.id)
    assert stored is not None
    assert (stored.state, stored.result) == ("done", 7)
    assert await kit.marked("via-store")


async def test_handler_error_rolls_back(kit: StoreKit) -> None:
    """An exception inside the completion block rolls everything back; the job stays leased."""
    job = await kit.store.enqueue("q", {})
    [lease] = await kit.store.claim("w", 1, 30.0)

    async def write_then_fail() -> None:
        async with lease.commit() as conn:
            await kit.mark(conn, "broken")
            raise RuntimeError("handler broke")

    with pytest.raises(RuntimeError, match="handler broke"):
        await write_then_fail()
    assert not await kit.marked("broken")
    stored = await kit.store.get(job.id)
    assert stored is not None
    assert stored.state == "leased"
    assert not lease.settled
    async with lease.commit():
        pass
    assert (await kit.store.get(job.id)).state == "done"


async def test_stale_complete_rejected(kit: StoreKit) -> None:
    """An old generation's late commit raises LeaseLostError; its writes never land."""
    stale, current = await _stale_and_current(kit)
    with pytest.raises(LeaseLostError) as caught:
        async with stale.commit("old result") as conn:
            await kit.mark(conn, "stale")
    assert caught.value.code == "JOB_LEASE_LOST"
    assert not await kit.marked("stale")
    async with current.commit("new result") as conn:
        await kit.mark(conn, "current")
    stored = await kit.store.get(current.job.id)
    assert stored is not None
    assert stored.result == "new result"
    assert await kit.marked("current")


async def test_stale_mutations_rejected(kit: StoreKit) -> None:
    """fail and release need the current fence; heartbeat reports the stale lease as lost."""
    stale, current = await _stale_and_current(kit)
    with pytest.raises(LeaseLostError):
        await kit.store.fail(stale, "late", retry_in=0)
    with pytest.raises(LeaseLostError):
        await kit.store.release(stale)
    assert await kit.store.heartbeat([stale, current], 30.0) == [stale]
    assert await kit.store.complete_many([(stale, None)]) == [stale]
    stored = await kit.store.get(current.job.id)
    assert stored is not None
    assert (stored.state, stored.fence) == ("leased", current.fence)


async def test_finished_lease_unusable(kit: StoreKit) -> None:
    """After completion every further mutation on the same lease is LeaseLostError."""
    await kit.store.enqueue("q", {})
    [lease] = await kit.store.claim("w", 1, 30.0)
    async with lease.commit():
        pass
    with pytest.raises(LeaseLostError):
        async with lease.commit():
            pass
    with pytest.raises(LeaseLostError):
        await kit.store.release(lease)
    assert await kit.store.heartbeat([lease], 30.0) == [lease]


async def test_heartbeat_extends_lease(kit: StoreKit) -> None:
    """A heartbeat moves lease_until forward, so the sweep leaves the job alone."""
    job = await kit.store.enqueue("q", {})
    [lease] = await kit.store.claim("w", 1, 0.3)
    assert await kit.store.heartbeat([lease], 30.0) == []
    await anyio.sleep(0.5)
    assert await kit.store.reclaim_expired() == 0
    stored = await kit.store.get(job.id)
    assert stored is not None
    assert stored.state == "leased"
    assert stored.lease_until is not None
    assert stored.lease_until > stored.run_after + 20


async def test_complete_many_reports_lost(kit: StoreKit) -> None:
    """complete_many finishes every held lease and returns the lost ones."""
    stale, current = await _stale_and_current(kit)
    await kit.store.enqueue("q", {"n": 2})
    [other] = await kit.store.claim("new", 1, 30.0)
    lost = await kit.store.complete_many([(current, {"r": 1}), (stale, None), (other, None)])
    assert lost == [stale]
    assert current.settled
    assert other.settled
    assert not stale.settled
    stored = await kit.store.get(current.job.id)
    assert stored is not None
    assert (stored.state, stored.result) == ("done", {"r": 1})


async def test_release_refunds_attempt(kit: StoreKit) -> None:
    """A released job is claimable at once with its attempt refunded and the fence kept."""
    job = await kit.store.enqueue("q", {})
    [lease] = await kit.store.claim("w", 1, 30.0)
    await kit.store.release(lease)
    stored = await kit.store.get(job.id)
    assert stored is not None
    assert (stored.state, stored.attempts, stored.fence, stored.lease_owner) == (
        "queued",
        0,
        1,
        None,
    )
    [again] = await kit.store.claim("w2", 1, 30.0)
    assert (again.fence, again.job.attempts) == (2, 1)


async def test_expiry_counts_the_attempt(kit: StoreKit) -> None:
    """The sweep requeues expired leases without refunding; valid leases stay."""
    expired = await kit.store.enqueue("q", {"n": 1})
    [short] = await kit.store.claim("w", 1, 0.2)
    await kit.store.enqueue("q", {"n": 2})
    [long] = await kit.store.claim("w", 1, 30.0)
    await anyio.sleep(0.4)
    assert await kit.store.reclaim_expired() == 1
    stored = await kit.store.get(expired.id)
    assert stored is not None
    assert (stored.state, stored.attempts, stored.last_error) == ("queued", 1, "lease expired")
    assert (await kit.store.get(long.job.id)).state == "leased"
    assert short.job.id == expired.id


async def test_fail_retries_then_dead(kit: StoreKit) -> None:
    """fail requeues after retry_in until max_attempts, then the job is dead."""
    job = await kit.store.enqueue("q", {}, max_attempts=2)
    [first] = await kit.store.claim("w", 1, 30.0)
    failed = await kit.store.fail(first, "RuntimeError: nope", retry_in=0.3)
    assert (failed.state, failed.attempts, failed.last_error) == ("queued", 1, "RuntimeError: nope")
    assert await kit.store.claim("w", 1, 30.0) == []
    await anyio.sleep(0.4)
    [second] = await kit.store.claim("w", 1, 30.0)
    dead = await kit.store.fail(second, "again", retry_in=0)
    assert (dead.state, dead.attempts) == ("dead", 2)
    assert await kit.store.claim("w", 1, 30.0) == []
    assert (await kit.store.get(job.id)).state == "dead"


async def test_expiry_at_max_is_dead(kit: StoreKit) -> None:
    """An expired lease on its last attempt buries the job instead of requeueing it."""
    job = await kit.store.enqueue("q", {}, max_attempts=1)
    await kit.store.claim("w", 1, 0.2)
    await anyio.sleep(0.4)
    assert await kit.store.reclaim_expired() == 1
    assert (await kit.store.get(job.id)).state == "dead"


async def test_release_owner_is_scoped(kit: StoreKit) -> None:
    """release_owner refunds every lease of one owner and no other."""
    for i in range(3):
        await kit.store.enqueue("q", {"i": i})
    mine = await kit.store.claim("old", 2, 30.0)
    [theirs] = await kit.store.claim("new", 1, 30.0)
    assert await kit.store.release_owner("old") == 2
    for lease in mine:
        stored = await kit.store.get(lease.job.id)
        assert stored is not None
        assert (stored.state, stored.attempts) == ("queued", 0)
    assert (await kit.store.get(theirs.job.id)).state == "leased"
    assert await kit.store.release_owner("old") == 0


async def test_sweep_spares_completion(kit: StoreKit) -> None:
    """A sweep that races an open completion cannot take the job; the completion wins."""
    job = await kit.store.enqueue("q", {})
    [lease] = await kit.store.claim("w", 1, 0.2)
    other = await kit.other()
    sweeps: list[int] = []

    async def sweep() -> None:
        sweeps.append(await other.reclaim_expired())

    async with anyio.create_task_group() as tg, lease.commit() as conn:
        await kit.mark(conn, "slow")
        await anyio.sleep(0.4)  # the lease expires while the handler writes
        tg.start_soon(sweep)  # skips the locked row, or waits for the lock
        await anyio.sleep(0.1)
    assert sweeps == [0]
    stored = await kit.store.get(job.id)
    assert stored is not None
    assert stored.state == "done"
    assert await kit.marked("slow")


async def test_claimers_never_share(kit: StoreKit) -> None:
    """Claimers on separate connections each get disjoint jobs and together get all."""
    total = 60
    for i in range(total):
        await kit.store.enqueue("q", {"i": i})
    handles = [kit.store] + [await kit.other() for _ in range(3)]
    claimed: list[list[int]] = [[] for _ in handles]

    async def claimer(index: int) -> None:
        while batch := await handles[index].claim(f"w{index}", 5, 30.0):
            claimed[index].extend(lease.job.id for lease in batch)
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        for index in range(len(handles)):
            tg.start_soon(claimer, index)
    everything = [job_id for ids in claimed for job_id in ids]
    assert len(everything) == len(set(everything)) == total
