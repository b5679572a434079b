"""PostgreSQL job store: psycopg 3 async with a :mod:`psycopg_pool` connection pool.

Claims take rows with ``FOR UPDATE SKIP LOCKED`` (concurrent claimers never block or collide),
every lease time comes from the database clock (``now()``), so generations on different hosts
agree on expiry. A completion first takes the job's row lock (``SELECT ... FOR NO KEY UPDATE``
with the fence check), then lets the handler write on the same connection, then marks the job
done, all in one transaction: a reclaim that races it waits for the lock and then sees ``done``.
Multi-row statements lock in id order or skip locked rows, so they cannot deadlock each other.

Tables live in their own schema (``schema="forgezero"`` by default), created and migrated by
:meth:`PostgresJobStore.open` under an advisory lock, so two generations opening at once are
safe and a second run is a no-op. Needs ``pip install 'forgezero-lifecycle[postgres]'``.

A pool the store owns checks each connection before handing it out, so after a server restart
the next enqueue gets a fresh connection instead of the dead one; the check is a zero-timeout
``select`` on the socket, not a round trip.
"""

from __future__ import annotations

import logging
import select
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, final

try:
    import psycopg
    from psycopg import sql
    from psycopg.types.json import set_json_loads
    from psycopg_pool import AsyncConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised only without the extra installed
    raise ImportError(
        "PostgresJobStore needs psycopg 3 and psycopg_pool: "
        "pip install 'forgezero-lifecycle[postgres]'"
    ) from exc

import orjson

from .._errors import ConfigurationError, IdempotencyConflictError, JobStoreError, LeaseLostError
from . import _pg_sql
from ._enqueue import Enqueue, Listeners, prepare_enqueue, prepare_enqueue_many, queued_job
from ._outcome import error_text, result_json
from ._pg_sql import Statements, row_to_job
from .store import Job, JobStatistics, Lease

__all__ = ["PgConnection", "PostgresJobStore"]

logger = logging.getLogger("forgezero_lifecycle.jobs")

PgConnection = psycopg.AsyncConnection[Any]


@contextmanager
def _store_errors() -> Iterator[None]:
    try:
        yield
    except (psycopg.Error, PoolTimeout) as exc:
        raise _store_error(exc) from exc


def _store_error(exc: Exception) -> JobStoreError:
    return JobStoreError(detail=f"PostgreSQL: {type(exc).__name__}: {exc}")


def _stored(found: tuple[Any, ...] | None, key: str, digest: str) -> Job:
    """The stored job ``key`` names (the row plus its payload hash), if its payload is the same."""
    if found is None:
        raise JobStoreError(detail=f"idempotency key {key!r} is being inserted; retry")
    if found[-1] != digest:
        raise _conflict(key)
    return row_to_job(found[:-1])


def _conflict(key: str) -> IdempotencyConflictError:
    return IdempotencyConflictError(
        detail=f"idempotency key {key!r} was used for a different queue or payload"
    )


def _lost(lease: Lease[PgConnection]) -> LeaseLostError:
    return LeaseLostError(detail=f"job {lease.job.id} lost its lease at fence {lease.fence}")


@final
class PostgresJobStore:
    """A :class:`~forgezero_lifecycle.jobs.store.JobStore` on PostgreSQL.

    Pass a ``dsn`` (the store owns its pool) or an open ``pool`` (the caller owns it; its
    connections must be in autocommit mode, and its own ``check=`` decides whether a dead
    connection can be handed out).
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: AsyncConnectionPool[Any] | None = None,
        schema: str = "forgezero",
        min_size: int = 1,
        max_size: int = 10,
    ) -> None:
        if (dsn is None) == (pool is None):
            raise ConfigurationError(detail="pass exactly one of dsn= or pool=")
        self.schema = _pg_sql.check_schema_name(schema)
        self._q = Statements.for_schema(sql.Identifier(schema).as_string(None))
        self._owns_pool = pool is None
        self._pool: AsyncConnectionPool[Any] = pool or AsyncConnectionPool(
            dsn or "",
            min_size=min_size,
            max_size=max_size,
            open=False,
            kwargs={"autocommit": True},
            configure=self._configure,
            check=self._check,
            name=f"forgezero-jobs-{schema}",
        )
        self._listeners = Listeners()
        self._deferred: dict[int, list[Callable[[], None]]] = {}

    @staticmethod
    async def _configure(conn: PgConnection) -> None:
        set_json_loads(orjson.loads, conn)

    @staticmethod
    async def _check(conn: PgConnection) -> None:
        """Raise if a pooled connection's server is gone; the pool then replaces it.

        An idle connection has nothing to read. A readable socket means the server closed it
        (a restart or ``pg_terminate_backend`` sends a FATAL message, then end of file) or sent
        something unasked, and only then is the round trip of
        :meth:`~psycopg_pool.AsyncConnectionPool.check_connection` paid. ``check_connection`` on
        every checkout adds a round trip to every enqueue: on a busy 2-core machine a checkout
        went from 9 to 257-316 us with it (9.3 with this probe), against an enqueue of 300-450 us.
        """
        probe = select.poll()  # not select.select: a busy server's descriptors pass 1024
        probe.register(conn.pgconn.socket, select.POLLIN)
        if probe.poll(0):
            await AsyncConnectionPool.check_connection(conn)

    async def open(self) -> None:
        """Open the pool (when owned) and create or migrate the schema."""
        with _store_errors():
            if self._owns_pool:
                await self._pool.open(wait=True)
            async with self._pool.connection() as conn, conn.transaction():
                lock_key = f"forgezero_lifecycle.jobs:{self.schema}"
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock_key,))
                for statement in self._q.schema_setup:
                    await conn.execute(statement)
                row = await (await conn.execute(self._q.version)).fetchone()
                current = int(row[0]) if row else 0
                if current > _pg_sql.LATEST:
                    raise JobStoreError(
                        "JOB_STORE_SCHEMA",
                        f"schema {self.schema!r} is at version {current}, newer than this "
                        f"library's {_pg_sql.LATEST}; upgrade forgezero-lifecycle",
                    )
                quoted = sql.Identifier(self.schema).as_string(None)
                for version in range(current + 1, _pg_sql.LATEST + 1):
                    for statement in _pg_sql.MIGRATIONS[version - 1]:
                        await conn.execute(statement.format(s=quoted))
                    await conn.execute(self._q.record_version, (version,))

    async def close(self) -> None:
        """Close the pool when this store created it."""
        if self._owns_pool:
            await self._pool.close()

    async def __aenter__(self) -> PostgresJobStore:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        return self._listeners.subscribe(callback)

    @asynccontextmanager
    async def _checkout(self) -> AsyncIterator[PgConnection]:
        """A connection of the pool; a pool with none to give in time is a JobStoreError."""
        pool = self._pool
        with _store_errors():
            conn = await pool.getconn()
        try:
            yield conn
        finally:
            await pool.putconn(conn)

    @asynccontextmanager
    async def _tx(self, check: Lease[PgConnection] | None = None) -> AsyncIterator[PgConnection]:
        async with self._checkout() as conn:
            deferred = self._deferred.setdefault(id(conn), [])
            try:
                async with conn.transaction():
                    if check is not None:
                        with _store_errors():
                            cur = await conn.execute(
                                self._q.held_for_update, check.key, prepare=True
                            )
                            held = await cur.fetchone()
                        if held is None:
                            raise _lost(check)
                    yield conn
                actions = list(deferred)
            finally:
                self._deferred.pop(id(conn), None)
        for action in actions:
            action()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[PgConnection]:
        async with self._tx() as conn:
            yield conn

    async def enqueue(
        self,
        queue: str,
        payload: Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        delay: float = 0.0,
        max_attempts: int = 5,
        conn: PgConnection | None = None,
    ) -> Job:
        prepared = prepare_enqueue(queue, payload, idempotency_key, delay, max_attempts)
        key = prepared.idempotency_key
        args = (queue, prepared.payload_text, prepared.payload_digest, key, max_attempts, delay)
        if conn is None:
            job = await self._insert_pooled(args)
            self._listeners.notify()
            return job
        job = await self._insert(conn, args)
        deferred = self._deferred.get(id(conn))
        if deferred is None:  # the caller's own connection: we cannot see its commit
            self._listeners.notify()
        else:
            deferred.append(self._listeners.notify)
        return job

    async def _insert_pooled(self, args: tuple[Any, ...]) -> Job:
        """:meth:`_insert` on a connection of the pool, as its own (autocommit) transaction.

        ``getconn``/``putconn`` (:meth:`_checkout`) and not ``pool.connection()``: that adds a
        second ``async with`` on the connection whose exit takes the connection's lock to
        commit, which in autocommit has nothing to commit; a checkout went from 15-19 to
        8-11 us. A caller's pool without autocommit (against the constructor's rule) still
        gets its transaction committed here, as the context manager would.
        """
        async with self._checkout() as conn:
            job = await self._insert(conn, args)
            if not conn.autocommit:
                with _store_errors():
                    await conn.commit()
        return job

    async def _insert(self, conn: PgConnection, args: tuple[Any, ...]) -> Job:
        # The payload comes back from the client's own JSON (as SQLite's store does it), not
        # from the row: RETURNING it made the server encode the jsonb and the client decode it.
        try:
            cur = await conn.execute(self._q.insert, args, prepare=True)
            row = await cur.fetchone()
            if row is not None:
                job_id, run_after = row
                payload = orjson.loads(args[1])
                return queued_job(job_id, args[0], payload, args[3], args[4], run_after)
            found = await (await conn.execute(self._q.by_key, (args[3],))).fetchone()
        except psycopg.Error as exc:
            raise _store_error(exc) from exc
        return _stored(found, args[3], args[2])

    async def enqueue_many(
        self,
        queue: str,
        payloads: Sequence[Mapping[str, Any]],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
        delay: float = 0.0,
        max_attempts: int = 5,
        conn: PgConnection | None = None,
    ) -> list[Job]:
        prepared = prepare_enqueue_many(queue, payloads, idempotency_keys, delay, max_attempts)
        if not prepared:
            return []
        args = {"queue": queue, "max_attempts": max_attempts, "delay": delay}
        if conn is None:
            async with self._tx() as own:
                jobs = await self._insert_many(own, args, prepared)
            self._listeners.notify()
            return jobs
        async with conn.transaction():  # a savepoint in the caller's transaction
            jobs = await self._insert_many(conn, args, prepared)
        deferred = self._deferred.get(id(conn))
        if deferred is None:
            self._listeners.notify()
        else:
            deferred.append(self._listeners.notify)
        return jobs

    async def _insert_many(
        self, conn: PgConnection, args: dict[str, Any], items: list[Enqueue]
    ) -> list[Job]:
        """One INSERT for the batch, one SELECT for the keys that already existed."""
        args["payloads"] = [item.payload_text for item in items]
        args["hashes"] = [item.payload_digest for item in items]
        args["keys"] = [item.idempotency_key for item in items]
        with _store_errors():
            rows = await (await conn.execute(self._q.insert_many, args)).fetchall()
            inserted = {row[1]: row for row in rows}
            missing = [key for key in dict.fromkeys(args["keys"]) if key not in inserted]
            found: dict[str, tuple[Any, ...]] = {}
            if missing:
                cur = await conn.execute(self._q.by_keys, (missing,))
                found = {row[3]: row for row in await cur.fetchall()}
        queue, max_attempts = args["queue"], args["max_attempts"]
        seen: dict[str, tuple[str, Job]] = {}
        jobs: list[Job] = []
        for item in items:
            key, digest = item.idempotency_key, item.payload_digest
            if key in seen:  # repeated in the batch: the first one's job, if the same payload
                if seen[key][0] != digest:
                    raise _conflict(key)
                job = seen[key][1]
            elif key in inserted:
                job_id, _, payload, run_after = inserted[key]
                job = queued_job(job_id, queue, payload, key, max_attempts, run_after)
            else:
                job = _stored(found.get(key), key, digest)
            seen[key] = (digest, job)
            jobs.append(job)
        return jobs

    async def _fetch(self, query: str, args: Any) -> list[tuple[Any, ...]]:
        with _store_errors():
            async with self._pool.connection() as conn:
                cur = await conn.execute(query, args, prepare=True)
                return await cur.fetchall() if cur.description else []

    async def _rowcount(self, query: str, args: Any) -> int:
        with _store_errors():
            async with self._pool.connection() as conn:
                cur = await conn.execute(query, args, prepare=True)
                return int(cur.rowcount)

    async def claim(
        self, owner: str, n: int, lease: float, *, queues: Collection[str] | None = None
    ) -> list[Lease[PgConnection]]:
        if n <= 0 or (queues is not None and not queues):
            return []
        args: dict[str, Any] = {"owner": owner, "n": n, "lease": lease}
        if queues is not None:
            args["queues"] = sorted(queues)
        query = self._q.claim_any if queues is None else self._q.claim_queues
        jobs = sorted(
            map(row_to_job, await self._fetch(query, args)), key=lambda j: (j.run_after, j.id)
        )
        return [Lease(self, job) for job in jobs]

    async def heartbeat(
        self, leases: Sequence[Lease[PgConnection]], lease: float
    ) -> list[Lease[PgConnection]]:
        if not leases:
            return []
        ids = [held.job.id for held in leases]
        fences = [held.fence for held in leases]
        rows = await self._fetch(self._q.heartbeat, (ids, fences, ids, lease))
        lost = {(r[0], r[1]) for r in rows}
        return [held for held in leases if held.key in lost]

    @asynccontextmanager
    async def complete(
        self, lease: Lease[PgConnection], result: Any = None
    ) -> AsyncIterator[PgConnection]:
        text = result_json(result)
        async with self._tx(lease) as conn:
            lease._set_committing(True)
            try:
                yield conn
                with _store_errors():
                    cur = await conn.execute(self._q.complete, (text, *lease.key), prepare=True)
                if cur.rowcount != 1:  # pragma: no cover - we hold the row lock
                    raise _lost(lease)
            finally:
                lease._set_committing(False)
        lease._settle()

    async def complete_many(
        self, items: Sequence[tuple[Lease[PgConnection], Any]]
    ) -> list[Lease[PgConnection]]:
        if not items:
            return []
        ids = [lease.job.id for lease, _ in items]
        fences = [lease.fence for lease, _ in items]
        results = [result_json(result) for _, result in items]
        rows = await self._fetch(self._q.complete_many, (ids, fences, results, ids, ids))
        done = {(r[0], r[1]) for r in rows}
        lost = []
        for lease, _ in items:
            if lease.key in done:
                lease._settle()
            else:
                lost.append(lease)
        return lost

    async def fail(self, lease: Lease[PgConnection], error: str, *, retry_in: float) -> Job:
        args = (max(0.0, retry_in), error_text(error), *lease.key)
        rows = await self._fetch(self._q.fail, args)
        if not rows:
            raise _lost(lease)
        lease._settle()
        return row_to_job(rows[0])

    async def release(self, lease: Lease[PgConnection]) -> None:
        if await self._rowcount(self._q.release, lease.key) == 0:
            raise _lost(lease)
        lease._settle()

    async def release_owner(self, owner: str) -> int:
        return await self._rowcount(self._q.release_owner, (owner,))

    async def reclaim_expired(self) -> int:
        return await self._rowcount(self._q.reclaim, ())

    async def get(self, job_id: int) -> Job | None:
        rows = await self._fetch(self._q.get, (job_id,))
        return row_to_job(rows[0]) if rows else None

    async def statistics(self) -> JobStatistics:
        rows = await self._fetch(self._q.stats, ())
        return JobStatistics(**{str(state): int(count) for state, count in rows})
