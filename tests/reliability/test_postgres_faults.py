"""PostgreSQL connections dropped under a running worker: it recovers, no job lost or doubled.

Two kinds of drop, both with ``pg_terminate_backend``: deterministic ones *mid-claim* (the test
locks the jobs table, waits until the worker's claim is blocked on that lock, terminates exactly
that backend, then unlocks) and random ones (any of the worker's connections, every few hundred
milliseconds, whatever it is doing: claiming, heartbeating, completing, idle in the pool).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import anyio
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from forgezero_lifecycle.jobs import JobStatistics, JobWorker, Lease
from forgezero_lifecycle.jobs.postgres import PostgresJobStore
from tests.jobs.conftest import postgres_dsn

from ._soak import report, scale

pytestmark = [pytest.mark.postgres, pytest.mark.anyio]

JOBS: Final = scale(300, 3000)
MID_CLAIM_KILLS: Final = scale(3, 25)
RANDOM_KILL_EVERY: Final = 0.25
#: Each drop can cost a job an attempt (a completion whose commit was cut is retried).
MAX_ATTEMPTS: Final = 10


class _Database:
    """The worker's store (its connections tagged with an application_name) and a killer."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.schema = f"fz_rel_{uuid.uuid4().hex[:12]}"
        self.app_name = f"fzrel-{uuid.uuid4().hex[:8]}"
        self.store = PostgresJobStore(
            make_conninfo(dsn, application_name=self.app_name), schema=self.schema, max_size=4
        )
        self.mid_claim_kills = 0
        self.other_kills = 0
        self.random_kills = 0

    async def blocked(self, conn: psycopg.AsyncConnection[Any]) -> list[tuple[int, str]]:
        """(pid, query) of the worker's backends waiting on a lock."""
        query = (
            "SELECT pid, query FROM pg_stat_activity"
            " WHERE application_name = %s AND wait_event_type = 'Lock'"
        )
        return [
            (row[0], row[1])
            for row in await (await conn.execute(query, (self.app_name,))).fetchall()
        ]

    async def backends(self, conn: psycopg.AsyncConnection[Any]) -> list[int]:
        query = "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
        return [row[0] for row in await (await conn.execute(query, (self.app_name,))).fetchall()]

    @asynccontextmanager
    async def table_locked(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """Hold the jobs table (every statement of the worker on it waits); yield a killer."""
        async with (
            await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as killer,
            await psycopg.AsyncConnection.connect(self.dsn) as locker,
        ):
            await locker.execute(f'LOCK TABLE "{self.schema}".jobs IN ACCESS EXCLUSIVE MODE')
            try:
                yield killer
            finally:
                await locker.rollback()

    async def kill_claims(self, killer: psycopg.AsyncConnection[Any], count: int) -> None:
        """Terminate ``count`` claims, each while it waits on the held table."""
        with anyio.fail_after(30):
            while self.mid_claim_kills < count:
                for pid, query in await self.blocked(killer):
                    # The expiry sweep runs just before a claim; it is dropped too, on the way.
                    await killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    if "due_jobs" in query:
                        self.mid_claim_kills += 1
                    else:
                        self.other_kills += 1
                await anyio.sleep(0.01)

    async def kill_randomly(self, stop: anyio.Event) -> None:
        rng = random.Random(5)
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as killer:
            while not stop.is_set():
                await anyio.sleep(RANDOM_KILL_EVERY)
                pids = await self.backends(killer)
                if pids:
                    await killer.execute("SELECT pg_terminate_backend(%s)", (rng.choice(pids),))
                    self.random_kills += 1

    async def effects(self) -> Counter[int]:
        async with await psycopg.AsyncConnection.connect(self.dsn) as conn:
            cur = await conn.execute(f'SELECT job_id FROM "{self.schema}".app_effects')
            return Counter(row[0] for row in await cur.fetchall())


@pytest.fixture
async def database() -> AsyncIterator[_Database]:
    made = _Database(postgres_dsn())
    await made.store.open()
    async with made.store.transaction() as conn:
        await conn.execute(f'CREATE TABLE "{made.schema}".app_effects (job_id bigint NOT NULL)')
    try:
        yield made
    finally:
        await made.store.close()
        async with await psycopg.AsyncConnection.connect(made.dsn, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{made.schema}" CASCADE')


@pytest.mark.timeout(scale(60, 600))
async def test_postgres_drop_mid_claim(
    database: _Database,
) -> None:
    """The worker recovers when PostgreSQL drops its connection mid-claim: terminated backends
    (mid-claim and at random) cost retries, never a lost or doubled job."""
    store = database.store
    worker: JobWorker[Any] = JobWorker(
        store, concurrency=4, lease=1.0, idle_interval=0.05, release_margin=0.2
    )

    @worker.handler("work")
    async def work(lease: Lease[Any]) -> None:
        await asyncio.sleep(0.02)
        async with lease.commit() as conn:
            insert = f'INSERT INTO "{database.schema}".app_effects (job_id) VALUES (%s)'
            await conn.execute(insert, (lease.job.id,))

    async with store.transaction() as conn:
        for number in range(JOBS):
            await store.enqueue(
                "work",
                {"n": number},
                idempotency_key=f"j{number}",
                max_attempts=MAX_ATTEMPTS,
                conn=conn,
            )
    stop = anyio.Event()
    try:
        async with database.table_locked() as killer:
            worker.start()  # holding no lease yet, it sweeps and claims, and waits on the lock
            await database.kill_claims(killer, MID_CLAIM_KILLS)
        async with anyio.create_task_group() as group:
            group.start_soon(database.kill_randomly, stop)
            with anyio.fail_after(scale(45, 500)):
                while (await _stats(store)).done < JOBS:  # noqa: ASYNC110 - database state
                    await anyio.sleep(0.1)
            stop.set()
    finally:
        stop.set()
        await worker.stop(timeout=2.0)

    statistics = worker.statistics()
    effects = await database.effects()
    report(
        "postgres-connection-dropped",
        jobs=JOBS,
        mid_claim_kills=database.mid_claim_kills,
        sweep_kills=database.other_kills,
        random_kills=database.random_kills,
        worker_claimed=statistics.claimed,
        worker_failed=statistics.failed,
        worker_lost=statistics.lost,
        last_error=(statistics.last_error or "")[:120],
        lost=JOBS - len(effects),
        doubled=sum(count > 1 for count in effects.values()),
    )
    assert database.mid_claim_kills == MID_CLAIM_KILLS
    assert statistics.last_error is not None, "no drop reached the worker"
    assert await _stats(store) == JobStatistics(done=JOBS)  # the last random drops may be pooled
    assert len(effects) == JOBS
    assert set(effects.values()) == {1}


async def _stats(store: PostgresJobStore) -> JobStatistics:
    """Job counts, read again if the test's own connection was caught by a random drop."""
    for _ in range(5):
        try:
            return await store.statistics()
        except Exception:
            await anyio.sleep(0.05)
    return await store.statistics()
