"""The embedded default job store: stdlib :mod:`sqlite3` in WAL mode, one writer per process.

Statements run on one dedicated thread per store (see :mod:`._sqlite_db` for why a
single-thread executor and not :func:`asyncio.to_thread`). Every write is a ``BEGIN IMMEDIATE``
transaction on the process's single writer connection, serialized by an :class:`asyncio.Lock`
(a completion transaction spans awaits). Across processes SQLite's file lock serializes writers
and ``busy_timeout`` makes a second process wait instead of failing, so an old and a new
generation on one host share the database file safely. Status reads use a second, read-only
connection that never waits for the writer (WAL). ``synchronous=FULL`` by default: a completed
or enqueued job survives power loss, not only a crashed process.

The handler's connection is a :class:`SQLiteTransaction` (``await conn.execute(sql, params)``).
Keep the work inside a completion block short: it holds the database's write lock, for this
process and for the other generation.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal, final

import orjson

from .._errors import (
    ConfigurationError,
    IdempotencyConflictError,
    JobStateError,
    JobStoreError,
    LeaseLostError,
)
from . import _sqlite_sql as q
from ._enqueue import Listeners, prepare_enqueue, prepare_enqueue_many, queued_job
from ._outcome import error_text, result_json
from ._sqlite_db import SQLiteDatabase, SQLiteTransaction
from .store import Job, JobStatistics, Lease

__all__ = ["SQLiteJobStore", "SQLiteTransaction"]


@final
class SQLiteJobStore:
    """A :class:`~forgezero_lifecycle.jobs.store.JobStore` on one SQLite database file."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 5.0,
        synchronous: Literal["NORMAL", "FULL"] = "FULL",
        now: Callable[[], float] = time.time,
    ) -> None:
        self._path = os.fspath(path)
        if self._path in ("", ":memory:") or self._path.startswith("file::memory:"):
            raise ConfigurationError(
                detail="SQLiteJobStore needs a database file that generations can share"
            )
        if synchronous not in ("NORMAL", "FULL"):
            raise ConfigurationError(
                detail=f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}"
            )
        self._now = now
        self._db = SQLiteDatabase(
            self._path, busy_ms=int(busy_timeout * 1000), synchronous=synchronous
        )
        self._listeners = Listeners()

    async def open(self) -> None:
        """Open both connections, switch to WAL and create or migrate the schema."""
        await self._db.open()

    async def close(self) -> None:
        """Close the connections and stop the thread. Safe to call twice."""
        await self._db.close()

    async def __aenter__(self) -> SQLiteJobStore:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        return self._listeners.subscribe(callback)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[SQLiteTransaction]:
        async with self._db.begin() as tx:
            yield tx
            await self._db.op(self._db.commit_sync)
        tx._end(committed=True)

    # -- the contract ---------------------------------------------------------------------------

    async def enqueue(
        self,
        queue: str,
        payload: Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        delay: float = 0.0,
        max_attempts: int = 5,
        conn: SQLiteTransaction | None = None,
    ) -> Job:
        prepared = prepare_enqueue(queue, payload, idempotency_key, delay, max_attempts)
        key = prepared.idempotency_key
        now = self._now()
        text, digest = prepared.payload_text, prepared.payload_digest
        row = (queue, text, digest, key, max_attempts, now + delay, now, now)
        insert = functools.partial(_insert, row=row)
        if conn is None:
            job = await self._db.write(insert)
            self._listeners.notify()
            return job
        if conn._db is not self._db:
            raise JobStateError(detail="conn belongs to a different SQLiteJobStore")
        conn._check()
        job = await self._db.op(insert, self._db.writer())
        conn._after_commit.append(self._listeners.notify)
        return job

    async def enqueue_many(
        self,
        queue: str,
        payloads: Sequence[Mapping[str, Any]],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
        delay: float = 0.0,
        max_attempts: int = 5,
        conn: SQLiteTransaction | None = None,
    ) -> list[Job]:
        prepared = prepare_enqueue_many(queue, payloads, idempotency_keys, delay, max_attempts)
        if not prepared:
            return []
        now = self._now()
        times = (now + delay, now, now)
        rows = [
            (queue, p.payload_text, p.payload_digest, p.idempotency_key, max_attempts, *times)
            for p in prepared
        ]
        insert = functools.partial(_insert_many, rows=rows)
        if conn is None:
            jobs = await self._db.write(insert)
            self._listeners.notify()
            return jobs
        if conn._db is not self._db:
            raise JobStateError(detail="conn belongs to a different SQLiteJobStore")
        conn._check()
        jobs = await self._db.op(insert, self._db.writer())
        conn._after_commit.append(self._listeners.notify)
        return jobs

    async def claim(
        self, owner: str, n: int, lease: float, *, queues: Collection[str] | None = None
    ) -> list[Lease[SQLiteTransaction]]:
        if n <= 0 or (queues is not None and not queues):
            return []
        now = self._now()
        args: tuple[Any, ...]
        if queues is None:
            sql, args = q.CLAIM_ANY, (owner, now + lease, now, now, n)
        else:
            names = orjson.dumps(sorted(queues)).decode()
            sql, args = q.CLAIM_QUEUES, (owner, now + lease, now, now, names, n)
        rows = await self._db.write(lambda c: c.execute(sql, args).fetchall())
        jobs = sorted((q.row_to_job(r) for r in rows), key=lambda j: (j.run_after, j.id))
        return [Lease(self, job) for job in jobs]

    async def heartbeat(
        self, leases: Sequence[Lease[SQLiteTransaction]], lease: float
    ) -> list[Lease[SQLiteTransaction]]:
        if not leases:
            return []
        until = self._now() + lease

        def run(c: sqlite3.Connection) -> list[Lease[SQLiteTransaction]]:
            return [
                held
                for held in leases
                if c.execute(q.HEARTBEAT, (until, held.job.id, held.fence)).rowcount == 0
            ]

        return await self._db.write(run)

    @asynccontextmanager
    async def complete(
        self, lease: Lease[SQLiteTransaction], result: Any = None
    ) -> AsyncIterator[SQLiteTransaction]:
        text = result_json(result)
        async with self._db.begin(lease.key) as tx:
            lease._set_committing(True)
            try:
                yield tx
                done = await self._db.op(self._finish_sync, text, lease.key)
            finally:
                lease._set_committing(False)
            if not done:
                raise LeaseLostError(
                    detail=f"job {lease.job.id} lost its lease at fence {lease.fence}"
                )
        tx._end(committed=True)
        lease._settle()

    def _finish_sync(self, text: str | None, key: tuple[int, int]) -> bool:
        conn = self._db.writer()
        if conn.execute(q.COMPLETE, (text, self._now(), *key)).rowcount == 0:
            return False
        conn.execute("COMMIT")
        return True

    async def complete_many(
        self, items: Sequence[tuple[Lease[SQLiteTransaction], Any]]
    ) -> list[Lease[SQLiteTransaction]]:
        if not items:
            return []
        texts = [result_json(result) for _, result in items]
        now = self._now()

        def run(c: sqlite3.Connection) -> list[bool]:
            return [
                c.execute(q.COMPLETE, (text, now, *lease.key)).rowcount == 1
                for (lease, _), text in zip(items, texts, strict=True)
            ]

        done = await self._db.write(run)
        lost = []
        for (lease, _), ok in zip(items, done, strict=True):
            if ok:
                lease._settle()
            else:
                lost.append(lease)
        return lost

    async def fail(self, lease: Lease[SQLiteTransaction], error: str, *, retry_in: float) -> Job:
        now = self._now()
        args = (now + max(0.0, retry_in), error_text(error), now, *lease.key)
        rows = await self._db.write(lambda c: c.execute(q.FAIL, args).fetchall())
        if not rows:
            raise LeaseLostError(detail=f"job {lease.job.id} lost its lease at fence {lease.fence}")
        lease._settle()
        return q.row_to_job(rows[0])

    async def release(self, lease: Lease[SQLiteTransaction]) -> None:
        now = self._now()
        count = await self._db.write(
            lambda c: c.execute(q.RELEASE, (now, now, *lease.key)).rowcount
        )
        if count == 0:
            raise LeaseLostError(detail=f"job {lease.job.id} lost its lease at fence {lease.fence}")
        lease._settle()

    async def release_owner(self, owner: str) -> int:
        now = self._now()
        return await self._db.write(
            lambda c: c.execute(q.RELEASE_OWNER, (now, now, owner)).rowcount
        )

    async def reclaim_expired(self) -> int:
        now = self._now()
        return await self._db.write(lambda c: c.execute(q.RECLAIM, (now, now, now)).rowcount)

    async def get(self, job_id: int) -> Job | None:
        rows = await self._db.read(q.GET, (job_id,))
        return q.row_to_job(rows[0]) if rows else None

    async def statistics(self) -> JobStatistics:
        rows = await self._db.read(q.STATS, ())
        return JobStatistics(**{str(state): int(count) for state, count in rows})


def _insert(conn: sqlite3.Connection, row: tuple[Any, ...]) -> Job:
    inserted = conn.execute(q.INSERT, row).fetchall()
    if inserted:
        queue, text, _, key, max_attempts, run_after = row[:6]
        return queued_job(inserted[0][0], queue, orjson.loads(text), key, max_attempts, run_after)
    found = conn.execute(q.BY_KEY, (row[3],)).fetchall()
    return _stored(found[0] if found else None, row)


def _resolve(
    rows: list[tuple[Any, ...]], ids: dict[str, int], found: dict[str, tuple[Any, ...]]
) -> list[Job]:
    """Each row's job: the one its insert wrote, else the stored one its key names."""
    seen: dict[str, tuple[str, Job]] = {}
    jobs = []
    for row in rows:
        key = row[3]
        if key in seen:  # repeated in the batch: the first one's job, if the payload is the same
            digest, job = seen[key]
            if digest != row[2]:
                raise _conflict(key)
            job = dataclasses.replace(job, payload=orjson.loads(row[1]))
        elif key in ids:
            job = queued_job(ids[key], row[0], orjson.loads(row[1]), key, row[4], row[5])
        else:
            job = _stored(found.get(key), row)
        seen[key] = (row[2], job)
        jobs.append(job)
    return jobs


def _conflict(key: str) -> IdempotencyConflictError:
    return IdempotencyConflictError(
        detail=f"idempotency key {key!r} was used for a different queue or payload"
    )


def _stored(found: tuple[Any, ...] | None, row: tuple[Any, ...]) -> Job:
    """The stored job ``row``'s key names, if it holds the same queue and payload."""
    if found is None:  # pragma: no cover - the conflicting row cannot vanish inside our tx
        raise JobStoreError(detail=f"idempotency key {row[3]!r} conflicted but was not found")
    if found[-1] != row[2]:
        raise _conflict(row[3])
    return q.row_to_job(found[:-1])


def _insert_many(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> list[Job]:
    """Every row or none: a savepoint, so a conflict undoes the batch inside a caller's tx.

    Multi-row inserts of up to 500 rows return the id of each row they wrote; only the keys
    that were already stored are read back (in one query) and checked as :func:`_insert` does
    it, and a key repeated in the batch gets its first item's job if the payload is the same.
    """
    conn.execute("SAVEPOINT forgezero_enqueue_many")
    try:
        chunk = max(1, min(500, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // 8))
        ids: dict[str, int] = {}
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            flat = [value for row in part for value in row]
            ids.update((key, job_id) for job_id, key in conn.execute(q.insert(len(part)), flat))
        missing = [key for key in dict.fromkeys(row[3] for row in rows) if key not in ids]
        found: dict[str, tuple[Any, ...]] = {}
        if missing:
            found = {
                hit[3]: hit for hit in conn.execute(q.BY_KEYS, (orjson.dumps(missing).decode(),))
            }
        jobs = _resolve(rows, ids, found)
    except BaseException:
        conn.execute("ROLLBACK TO forgezero_enqueue_many")
        conn.execute("RELEASE forgezero_enqueue_many")
        raise
    conn.execute("RELEASE forgezero_enqueue_many")
    return jobs
