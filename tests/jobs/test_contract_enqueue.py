"""JobStore contract, part 1: enqueue, idempotency, claim order, reads."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import pytest

from forgezero_lifecycle._errors import IdempotencyConflictError, JobInvalidError
from forgezero_lifecycle.jobs import JobStatistics

from .conftest import StoreKit

pytestmark = pytest.mark.anyio


async def test_enqueue_returns_queued(kit: StoreKit) -> None:
    """A new job is queued with no attempts, fence 0 and its payload intact."""
    job = await kit.store.enqueue("email", {"to": "a@example.com", "n": [1, 2]}, max_attempts=3)
    assert job.state == "queued"
    assert (job.attempts, job.fence, job.max_attempts) == (0, 0, 3)
    assert job.payload == {"to": "a@example.com", "n": [1, 2]}
    assert job.lease_owner is None
    assert job.lease_until is None
    assert await kit.store.get(job.id) == job


async def test_same_key_returns_existing(kit: StoreKit) -> None:
    """Enqueue is idempotent on the key: a repeat returns the first job, adds nothing."""
    first = await kit.store.enqueue("email", {"b": 1, "a": 2}, idempotency_key="k1")
    again = await kit.store.enqueue("email", {"a": 2, "b": 1}, idempotency_key="k1")
    assert again.id == first.id
    assert (await kit.store.statistics()).total == 1


async def test_reused_key_conflicts(kit: StoreKit) -> None:
    """A reused key with a different payload or queue raises IdempotencyConflictError."""
    await kit.store.enqueue("email", {"a": 1}, idempotency_key="k1")
    with pytest.raises(IdempotencyConflictError) as caught:
        await kit.store.enqueue("email", {"a": 2}, idempotency_key="k1")
    assert caught.value.code == "JOB_IDEMPOTENCY_CONFLICT"
    with pytest.raises(IdempotencyConflictError):
        await kit.store.enqueue("sms", {"a": 1}, idempotency_key="k1")
    assert (await kit.store.statistics()).total == 1


async def test_no_key_never_deduplicates(kit: StoreKit) -> None:
    """Without a key every enqueue is a new job with a generated key."""
    a = await kit.store.enqueue("q", {"x": 1})
    b = await kit.store.enqueue("q", {"x": 1})
    assert a.id != b.id
    assert a.idempotency_key != b.idempotency_key


async def test_enqueue_rejects_bad_args(kit: StoreKit) -> None:
    """Bad input raises JobInvalidError (JOB_INVALID, a ValueError) and writes nothing."""
    bad_calls: list[tuple[str, Any, dict[str, Any]]] = [
        ("", {}, {}),
        ("q", {}, {"max_attempts": 0}),
        ("q", {}, {"delay": -1}),
        ("q", {}, {"delay": float("nan")}),
        ("q", ["not", "a", "mapping"], {}),
        ("q", {"when": {1, 2}}, {}),
    ]
    for queue, payload, options in bad_calls:
        with pytest.raises(JobInvalidError) as caught:
            await kit.store.enqueue(queue, payload, **options)
        assert caught.value.code == "JOB_INVALID"
        assert isinstance(caught.value, ValueError)
    assert (await kit.store.statistics()).total == 0


async def test_enqueue_in_transaction(kit: StoreKit) -> None:
    """With conn=, the job commits or rolls back with the caller's transaction."""

    async def enqueue_then_fail() -> None:
        async with kit.store.transaction() as conn:
            await kit.store.enqueue("q", {"n": 1}, idempotency_key="rolled", conn=conn)
            await kit.mark(conn, "rolled")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await enqueue_then_fail()
    assert (await kit.store.statistics()).total == 0
    assert not await kit.marked("rolled")
    async with kit.store.transaction() as conn:
        job = await kit.store.enqueue("q", {"n": 2}, idempotency_key="kept", conn=conn)
        await kit.mark(conn, "kept")
    assert (await kit.store.get(job.id)) is not None
    assert await kit.marked("kept")


async def test_plain_enqueue_is_separate(kit: StoreKit) -> None:
    """A plain enqueue is its own transaction, whether it starts before or during another
    task's transaction: that transaction's rollback never takes it."""

    async def enqueue_then_fail(tg: anyio.abc.TaskGroup) -> None:
        async with kit.store.transaction() as conn:
            await kit.store.enqueue("inside", {"n": 2}, conn=conn)
            tg.start_soon(kit.store.enqueue, "during", {"n": 3})
            await anyio.lowlevel.checkpoint()
            raise RuntimeError("boom")

    async with anyio.create_task_group() as tg:
        tg.start_soon(kit.store.enqueue, "before", {"n": 1})
        await anyio.lowlevel.checkpoint()  # the enqueue is under way, not finished
        with pytest.raises(RuntimeError, match="boom"):
            await enqueue_then_fail(tg)
    queues = {lease.job.queue for lease in await kit.store.claim("w", 10, 30.0)}
    assert queues == {"before", "during"}


async def test_subscribe_after_commit(kit: StoreKit) -> None:
    """subscribe() calls back on every enqueue, after the transaction commits."""
    calls: list[int] = []
    unsubscribe = kit.store.subscribe(lambda: calls.append(1))
    await kit.store.enqueue("q", {})
    assert calls == [1]
    async with kit.store.transaction() as conn:
        await kit.store.enqueue("q", {}, conn=conn)
        assert calls == [1]
    assert calls == [1, 1]
    unsubscribe()
    await kit.store.enqueue("q", {})
    assert calls == [1, 1]


async def test_claim_due_jobs_in_order(kit: StoreKit) -> None:
    """Claims take due jobs by run_after then id, at most n, and skip delayed ones."""
    later = await kit.store.enqueue("q", {"i": "later"}, delay=0.4)
    ids = [(await kit.store.enqueue("q", {"i": i})).id for i in range(3)]
    first = await kit.store.claim("w1", 2, 30.0)
    assert [lease.job.id for lease in first] == ids[:2]
    rest = await kit.store.claim("w1", 5, 30.0)
    assert [lease.job.id for lease in rest] == ids[2:]
    assert await kit.store.claim("w1", 5, 30.0) == []
    await anyio.sleep(0.5)
    due = await kit.store.claim("w1", 5, 30.0)
    assert [lease.job.id for lease in due] == [later.id]


async def test_claim_leases_and_fences(kit: StoreKit) -> None:
    """A claim leases to the owner, raises the fence and counts an attempt."""
    job = await kit.store.enqueue("q", {})
    [lease] = await kit.store.claim("w1", 1, 30.0)
    assert (lease.fence, lease.owner) == (1, "w1")
    stored = await kit.store.get(job.id)
    assert stored is not None
    assert (stored.state, stored.attempts, stored.fence, stored.lease_owner) == (
        "leased",
        1,
        1,
        "w1",
    )
    assert stored.lease_until is not None
    assert stored.lease_until > stored.run_after


async def test_claim_filters_by_queue(kit: StoreKit) -> None:
    """queues= limits a claim to the queues a worker has handlers for."""
    await kit.store.enqueue("a", {})
    b = await kit.store.enqueue("b", {})
    assert [lease.job.id for lease in await kit.store.claim("w", 5, 30.0, queues=["b"])] == [b.id]
    assert await kit.store.claim("w", 5, 30.0, queues=[]) == []
    assert await kit.store.claim("w", 0, 30.0) == []


async def test_stats_count_every_state(kit: StoreKit) -> None:
    """statistics() counts queued, leased, done and dead jobs."""
    for i in range(4):
        await kit.store.enqueue("q", {"i": i}, max_attempts=1)
    one, two, _three = await kit.store.claim("w", 3, 30.0)
    async with one.commit():
        pass
    await kit.store.fail(two, "x", retry_in=0)
    assert await kit.store.statistics() == JobStatistics(queued=1, leased=1, done=1, dead=1)
    assert await kit.store.get(10_000) is None
