"""The demo's durable jobs: the store, the handler's own write, and the stale-commit check.

Every job handler writes one row to ``demo_effects`` in the same transaction that completes the
job, so "completed exactly once" is a fact of the database: one effect row per job. A frozen
worker (claims a job, stops heartbeating, wakes after the new generation reclaimed and finished
it) shows the fence at work: its commit is rejected and its write rolled back.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

from .._errors import LeaseLostError
from ..jobs import JobStore, Lease, SQLiteJobStore

__all__ = [
    "WORK_QUEUE",
    "ZOMBIE_QUEUE",
    "JobTally",
    "freeze_one",
    "open_store",
    "prepare",
    "record_effect",
    "tally",
    "wake_frozen",
]

WORK_QUEUE: Final = "demo.work"
ZOMBIE_QUEUE: Final = "demo.frozen"
FROZEN_OWNER: Final = "frozen-worker-of-A"
FROZEN_LEASE: Final = 0.5


async def open_store(target: str, schema: str | None = None) -> Any:
    """An open SQLite store (a file path) or PostgreSQL store (a ``postgresql://`` DSN)."""
    if target.startswith(("postgres://", "postgresql://")):
        from ..jobs.postgres import PostgresJobStore

        store: Any = PostgresJobStore(target, schema=schema or "forgezero_demo", max_size=4)
    else:
        store = SQLiteJobStore(target)
    await store.open()
    return store


def _table(store: Any) -> str:
    return "demo_effects" if isinstance(store, SQLiteJobStore) else f"{store.schema}.demo_effects"


async def _rows(store: Any, conn: Any, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    if isinstance(store, SQLiteJobStore):
        rows: list[Any] = await conn.execute(sql, params)
        return rows
    cursor = await conn.execute(sql.replace("?", "%s"), params)
    return list(await cursor.fetchall()) if cursor.description else []


async def prepare(store: Any) -> None:
    """Create the handler's table (the application's own data, beside the jobs)."""
    async with store.transaction() as conn:
        await _rows(
            store,
            conn,
            f"CREATE TABLE IF NOT EXISTS {_table(store)} "
            "(job_id BIGINT NOT NULL, generation TEXT NOT NULL, fence BIGINT NOT NULL)",
        )


async def record_effect(store: Any, conn: Any, job_id: int, generation: str, fence: int) -> None:
    """The handler's write: committed with the job's completion, or not at all."""
    await _rows(
        store,
        conn,
        f"INSERT INTO {_table(store)} (job_id, generation, fence) VALUES (?, ?, ?)",
        (job_id, generation, fence),
    )


async def freeze_one(store: JobStore[Any], run: str) -> Lease[Any]:
    """Enqueue a job and claim it as a worker that then freezes (no heartbeats)."""
    await store.enqueue(ZOMBIE_QUEUE, {"seconds": 0.05}, idempotency_key=f"demo:{run}:frozen")
    leases = await store.claim(FROZEN_OWNER, 1, FROZEN_LEASE, queues=(ZOMBIE_QUEUE,))
    if not leases:
        raise RuntimeError("the frozen worker could not claim its job")
    return leases[0]


async def wake_frozen(store: Any, lease: Lease[Any], bound: float) -> bool:
    """Once the new generation finished the job, the frozen worker tries to commit it.

    Returns True when the store rejected the stale commit (the fence moved on).
    """
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        job = await store.get(lease.job.id)
        if job is not None and job.state == "done":
            break
        await asyncio.sleep(0.1)
    try:
        async with lease.commit({"by": "frozen"}) as conn:
            await record_effect(store, conn, lease.job.id, "frozen", lease.fence)
    except LeaseLostError:
        return True
    return False


@dataclass
class JobTally:
    """Where every enqueued job ended up."""

    enqueued: int = 0
    completed_once: int = 0
    completed_twice: int = 0
    lost: int = 0
    by_generation: Counter[str] = field(default_factory=Counter)


async def tally(store: Any, job_ids: list[int], bound: float) -> JobTally:
    """Wait (bounded) until every job is done, then count effects per job."""
    deadline = time.monotonic() + bound
    pending = set(job_ids)
    while pending and time.monotonic() < deadline:
        for job_id in list(pending):
            job = await store.get(job_id)
            if job is not None and job.state == "done":
                pending.discard(job_id)
        if pending:
            await asyncio.sleep(0.2)
    async with store.transaction() as conn:
        rows = await _rows(store, conn, f"SELECT job_id, generation FROM {_table(store)}")
    effects: dict[int, list[str]] = {}
    for job_id, generation in rows:
        effects.setdefault(int(job_id), []).append(str(generation))
    result = JobTally(enqueued=len(job_ids))
    for job_id in job_ids:
        done = effects.get(job_id, [])
        if len(done) == 1 and job_id not in pending:
            result.completed_once += 1
            result.by_generation[done[0]] += 1
        elif len(done) > 1:
            result.completed_twice += 1
        else:
            result.lost += 1
    return result
