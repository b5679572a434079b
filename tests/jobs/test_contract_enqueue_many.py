"""JobStore contract: enqueue_many, one transaction for a batch, idempotent per key."""

from __future__ import annotations

from typing import Any

import pytest

from forgezero_lifecycle._errors import IdempotencyConflictError, JobInvalidError

from .conftest import StoreKit

pytestmark = pytest.mark.anyio


async def test_batch_returned_in_order(kit: StoreKit) -> None:
    """Each payload becomes one queued job, returned in the order given, readable by id."""
    jobs = await kit.store.enqueue_many("email", [{"n": n} for n in range(5)], max_attempts=3)
    assert [job.payload for job in jobs] == [{"n": n} for n in range(5)]
    assert len({job.id for job in jobs}) == 5
    assert {(job.state, job.queue, job.max_attempts, job.fence) for job in jobs} == {
        ("queued", "email", 3, 0)
    }
    for job in jobs:
        assert await kit.store.get(job.id) == job
    assert (await kit.store.statistics()).queued == 5


async def test_batch_idempotent_per_key(kit: StoreKit) -> None:
    """A key that exists (or repeats in the batch) with the same payload returns that job."""
    first = await kit.store.enqueue("q", {"a": 1}, idempotency_key="k1")
    jobs = await kit.store.enqueue_many(
        "q",
        [{"a": 1}, {"b": 2}, {"b": 2}, {"c": 3}],
        idempotency_keys=["k1", "k2", "k2", None],
    )
    assert jobs[0].id == first.id
    assert jobs[1].id == jobs[2].id != first.id
    assert jobs[3].idempotency_key.startswith("auto:")
    assert (await kit.store.statistics()).total == 3
    again = await kit.store.enqueue_many("q", [{"b": 2}], idempotency_keys=["k2"])
    assert again[0].id == jobs[1].id
    assert (await kit.store.statistics()).total == 3


async def test_stored_key_repeated(
    kit: StoreKit,
) -> None:
    """A key already stored and given twice in the batch names the stored job both times."""
    first = await kit.store.enqueue("q", {"a": 1}, idempotency_key="k1")
    jobs = await kit.store.enqueue_many("q", [{"a": 1}, {"a": 1}], idempotency_keys=["k1", "k1"])
    stored = await kit.store.get(first.id)
    assert jobs == [stored, stored]
    assert (await kit.store.statistics()).total == 1


@pytest.mark.parametrize(
    ("payloads", "keys"),
    [
        ([{"new": 1}, {"a": 2}], ["fresh", "k1"]),  # conflicts with a stored job
        ([{"new": 1}, {"x": 1}, {"x": 2}], ["fresh", "dup", "dup"]),  # within the batch
    ],
    ids=["stored", "in-batch"],
)
async def test_conflict_writes_nothing(
    kit: StoreKit, payloads: list[dict[str, Any]], keys: list[str]
) -> None:
    """A reused key with another payload raises IdempotencyConflictError and no item is added."""
    await kit.store.enqueue("q", {"a": 1}, idempotency_key="k1")
    with pytest.raises(IdempotencyConflictError) as caught:
        await kit.store.enqueue_many("q", payloads, idempotency_keys=keys)
    assert caught.value.code == "JOB_IDEMPOTENCY_CONFLICT"
    assert (await kit.store.statistics()).total == 1
    fresh = await kit.store.enqueue("q", {"other": True}, idempotency_key="fresh")
    assert fresh.payload == {"other": True}  # "fresh" was never written


async def test_batch_in_transaction(kit: StoreKit) -> None:
    """With conn=, the batch commits or rolls back with the caller's own writes."""

    async def enqueue_then_fail() -> None:
        async with kit.store.transaction() as conn:
            await kit.store.enqueue_many("q", [{"n": 1}, {"n": 2}], conn=conn)
            await kit.mark(conn, "rolled")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await enqueue_then_fail()
    assert (await kit.store.statistics()).total == 0
    assert not await kit.marked("rolled")
    async with kit.store.transaction() as conn:
        jobs = await kit.store.enqueue_many("q", [{"n": 3}, {"n": 4}], conn=conn)
        await kit.mark(conn, "kept")
    assert [(await kit.store.get(job.id)) for job in jobs] == jobs
    assert await kit.marked("kept")


async def test_conflict_in_transaction(
    kit: StoreKit,
) -> None:
    """A refused batch leaves the caller's transaction as it was, so it can still commit."""
    await kit.store.enqueue("q", {"a": 1}, idempotency_key="k1")
    async with kit.store.transaction() as conn:
        await kit.mark(conn, "mine")
        with pytest.raises(IdempotencyConflictError):
            await kit.store.enqueue_many(
                "q", [{"new": 1}, {"a": 2}], idempotency_keys=["fresh", "k1"], conn=conn
            )
    assert await kit.marked("mine")
    assert (await kit.store.statistics()).total == 1


async def test_batch_checked_like_enqueue(kit: StoreKit) -> None:
    """Every item passes enqueue's checks, or JobInvalidError is raised and nothing is added."""
    bad_calls: list[tuple[str, Any, dict[str, Any]]] = [
        ("", [{}], {}),
        ("", [], {}),
        ("q", [{}], {"max_attempts": 0}),
        ("q", [], {"delay": -1}),
        ("q", [{"ok": 1}, ["not", "a", "mapping"]], {}),
        ("q", [{"ok": 1}, {"when": {1, 2}}], {}),
        ("q", {"a": 1}, {}),
        ("q", [{}, {}], {"idempotency_keys": ["only-one"]}),
        ("q", [{}], {"idempotency_keys": "k"}),
    ]
    for queue, payloads, options in bad_calls:
        with pytest.raises(JobInvalidError) as caught:
            await kit.store.enqueue_many(queue, payloads, **options)
        assert caught.value.code == "JOB_INVALID"
    assert (await kit.store.statistics()).total == 0
    assert await kit.store.enqueue_many("q", []) == []


async def test_subscribe_once_per_batch(kit: StoreKit) -> None:
    """subscribe() is called once per committed batch, not per item."""
    calls: list[int] = []
    kit.store.subscribe(lambda: calls.append(1))
    await kit.store.enqueue_many("q", [{}, {}, {}])
    assert calls == [1]
    async with kit.store.transaction() as conn:
        await kit.store.enqueue_many("q", [{}, {}], conn=conn)
        assert calls == [1]
    assert calls == [1, 1]
