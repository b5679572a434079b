"""The durable job store a test shares with its generations, and what the handlers wrote."""

from __future__ import annotations

import sqlite3
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import psycopg

from forgezero_lifecycle.jobs import JobStatistics, SQLiteJobStore
from forgezero_lifecycle.jobs.postgres import PostgresJobStore

__all__ = ["SharedJobs", "open_shared_jobs"]


@dataclass
class SharedJobs:
    """One job database: the test's own store handle and the settings its generations get."""

    kind: str
    target: str
    schema: str
    store: Any

    @property
    def env(self) -> dict[str, str]:
        return {"FZREL_JOBS": self.target, "FZREL_JOBS_SCHEMA": self.schema}

    async def enqueue(self, count: int, *, max_attempts: int = 5) -> list[int]:
        ids = []
        async with self.store.transaction() as conn:
            for number in range(count):
                job = await self.store.enqueue(
                    "work",
                    {"n": number},
                    idempotency_key=f"job-{number}",
                    max_attempts=max_attempts,
                    conn=conn,
                )
                ids.append(job.id)
        return ids

    async def wait_done(self, total: int, seconds: float = 30.0) -> None:
        with anyio.fail_after(seconds):
            while await self.store.statistics() != JobStatistics(done=total):  # noqa: ASYNC110 - database state
                await anyio.sleep(0.05)

    async def effects(self) -> list[tuple[int, int, str]]:
        """(job id, fence, generation) of every committed effect row."""
        if self.kind == "sqlite":
            with sqlite3.connect(self.target) as conn:
                rows = conn.execute("SELECT job_id, fence, gen FROM app_effects").fetchall()
            conn.close()
            return [tuple(row) for row in rows]
        async with await psycopg.AsyncConnection.connect(self.target) as conn:
            cur = await conn.execute(f'SELECT job_id, fence, gen FROM "{self.schema}".app_effects')
            return [tuple(row) for row in await cur.fetchall()]

    async def effects_per_job(self) -> Counter[int]:
        return Counter(job_id for job_id, _, _ in await self.effects())

    def insert(self, job_id: int, fence: int, gen: str) -> tuple[str, tuple[Any, ...]]:
        """The effect insert, as a handler would write it."""
        if self.kind == "sqlite":
            return "INSERT INTO app_effects (job_id, fence, gen) VALUES (?, ?, ?)", (
                job_id,
                fence,
                gen,
            )
        sql = f'INSERT INTO "{self.schema}".app_effects (job_id, fence, gen) VALUES (%s, %s, %s)'
        return sql, (job_id, fence, gen)

    async def close(self) -> None:
        await self.store.close()
        if self.kind == "postgres":
            async with await psycopg.AsyncConnection.connect(self.target, autocommit=True) as conn:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


async def open_shared_jobs(kind: str, directory: Path, dsn: str | None) -> SharedJobs:
    """A fresh job database with the app's effect table, opened by the test."""
    if kind == "sqlite":
        path = str(directory / "jobs.db")
        lite = SQLiteJobStore(path)
        await lite.open()
        async with lite.transaction() as tx:
            await tx.execute(
                "CREATE TABLE IF NOT EXISTS app_effects "
                "(job_id INTEGER NOT NULL, fence INTEGER NOT NULL, gen TEXT NOT NULL)"
            )
        return SharedJobs("sqlite", path, "forgezero", lite)
    assert dsn is not None
    schema = f"fz_rel_{uuid.uuid4().hex[:12]}"
    pg = PostgresJobStore(dsn, schema=schema, max_size=4)
    await pg.open()
    async with pg.transaction() as conn:
        await conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{schema}".app_effects '
            "(job_id bigint NOT NULL, fence bigint NOT NULL, gen text NOT NULL)"
        )
    return SharedJobs("postgres", dsn, schema, pg)
