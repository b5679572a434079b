"""The example's work besides requests: durable jobs, a per-user queue and a periodic job.

* Durable jobs (``send-receipt``): enqueued by ``POST /orders``, stored in SQLite by default
  (``FORGEZERO_JOBS_DB``, a file both generations share) or PostgreSQL (``FORGEZERO_JOBS_DSN``).
  The handler writes its receipt row in the same transaction that completes the job, and only
  while it still holds the job's fence: a generation whose job was reclaimed cannot commit.
* A keyed queue: each user's ledger entries are applied strictly in order, users in parallel.
* A scheduler: one periodic job whose status the control plane serves at
  ``GET /.forgezero/runtime/schedules/v1/status``.

All three join the runtime's drain: claiming, queue intake and ticks stop in the instant the
gate closes, and rollback restarts them.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import defaultdict
from typing import Any, Final

from forgezero_lifecycle import KeyedQueue, Runtime, Scheduler
from forgezero_lifecycle.jobs import JobWorker, Lease, SQLiteJobStore

RECEIPT_QUEUE: Final = "send-receipt"
logger = logging.getLogger("examples.fastapi_app")


class Work:
    """The store, the worker, the queue and the scheduler of one generation."""

    def __init__(self) -> None:
        self.dsn = os.environ.get("FORGEZERO_JOBS_DSN") or None
        self.path = os.environ.get("FORGEZERO_JOBS_DB", "forgezero-example-jobs.sqlite3")
        self.store: Any = None
        self.worker: JobWorker[Any] | None = None
        self.queue = KeyedQueue(width=16)
        self.ledgers: dict[str, list[str]] = defaultdict(list)
        self.scheduler = Scheduler()
        self.scheduler.add("report-pending-jobs", self._report, every=30)

    async def start(self, runtime: Runtime) -> None:
        if self.dsn:
            from forgezero_lifecycle.jobs import PostgresJobStore

            self.store = PostgresJobStore(self.dsn, schema="forgezero_example")
        else:
            self.store = SQLiteJobStore(self.path)
        await self.store.open()
        await self._create_receipts_table()
        self.worker = JobWorker(self.store, {RECEIPT_QUEUE: self._send_receipt}, lease=10)
        for participant in (self.worker, self.queue.participant(), self.scheduler.participant()):
            runtime.add(participant)
        self.worker.start()
        self.scheduler.start()

    async def stop(self) -> None:
        await self.scheduler.stop(timeout=5)
        if self.worker is not None:
            await self.worker.stop(timeout=5)
        if self.store is not None:
            await self.store.close()

    # -- durable jobs ------------------------------------------------------------------------

    async def enqueue_receipt(self, user: str, order: str) -> int:
        """Enqueue once per order: a retried POST with the same order id is the same job."""
        job = await self.store.enqueue(
            RECEIPT_QUEUE, {"user": user, "order": order}, idempotency_key=f"receipt:{order}"
        )
        return int(job.id)

    async def job(self, job_id: int) -> dict[str, object] | None:
        job = await self.store.get(job_id)
        if job is None:
            return None
        return {"id": job.id, "state": job.state, "attempts": job.attempts, "result": job.result}

    async def _send_receipt(self, lease: Lease[Any]) -> None:
        # Work with effects outside the database (an email) must pass the idempotency key on,
        # so a provider can drop a repeat; the receipt row below commits exactly once.
        await asyncio.sleep(0.2)
        async with lease.commit({"sent": True}) as conn:
            await self._sql(
                conn,
                "INSERT INTO receipts (job_id, order_id, fence) VALUES (?, ?, ?)",
                (lease.job.id, lease.job.payload["order"], lease.fence),
            )

    async def _create_receipts_table(self) -> None:
        table = "receipts (job_id BIGINT PRIMARY KEY, order_id TEXT NOT NULL, fence BIGINT)"
        async with self.store.transaction() as conn:
            await self._sql(conn, f"CREATE TABLE IF NOT EXISTS {table}", ())

    async def _sql(self, conn: Any, sql: str, params: tuple[object, ...]) -> None:
        if isinstance(self.store, SQLiteJobStore):
            await conn.execute(sql, params)
        else:  # psycopg: %s placeholders, and the example's own schema
            qualified = sql.replace("receipts", "forgezero_example.receipts")
            await conn.execute(qualified.replace("?", "%s"), params)

    # -- per-user serial work ------------------------------------------------------------------

    async def append_to_ledger(self, user: str, entry: str) -> list[str]:
        """Entries of one user apply in submission order; other users run in parallel."""
        return await self.queue.run(f"user:{user}", self._append, user, entry)

    async def _append(self, user: str, entry: str) -> list[str]:
        await asyncio.sleep(0.05)  # e.g. a call to a payment provider that must not reorder
        self.ledgers[user].append(entry)
        return list(self.ledgers[user])

    # -- periodic job --------------------------------------------------------------------------

    async def _report(self) -> None:
        stats = await self.store.statistics()
        logger.info("jobs queued=%d leased=%d done=%d", stats.queued, stats.leased, stats.done)
