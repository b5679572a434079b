"""Durable jobs in a FastAPI app, on SQLite: docs/jobs.md's quick start, as it runs."""

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from forgezero_lifecycle import JobWorker, Lease, Runtime, SQLiteJobStore

# One file, shared by the old and the new generation.
store = SQLiteJobStore("jobs.sqlite3")
worker: JobWorker[Any] = JobWorker(store, lease=30)
runtime = Runtime(
    control_token=os.environ["FORGEZERO_CONTROL_TOKEN"],
    revision=os.environ["FORGEZERO_REVISION"],
    not_ready_grace=float(os.environ.get("FORGEZERO_NOT_READY_GRACE", "0")),
    stream_grace=float(os.environ.get("FORGEZERO_STREAM_GRACE", "5")),
)
# A drain stops claiming, and releases what is left near its deadline.
runtime.add(worker)

RECEIPTS_TABLE = "CREATE TABLE IF NOT EXISTS receipts (order_id TEXT PRIMARY KEY)"


@worker.handler("send-receipt")
async def send_receipt(lease: Lease[Any]) -> None:
    order = lease.job.payload["order"]
    # Your write and the job's completion commit in one transaction, under its fence.
    async with lease.commit({"sent": True}) as conn:
        await conn.execute("INSERT INTO receipts (order_id) VALUES (?)", (order,))


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    await store.open()
    async with store.transaction() as conn:
        await conn.execute(RECEIPTS_TABLE)
    worker.start()
    try:
        yield
    finally:
        await worker.stop()
        await store.close()
        await runtime.aclose()


app = FastAPI(lifespan=lifespan)
runtime.install(app)


@app.post("/orders/{order}", status_code=202)
async def place_order(order: str) -> dict[str, int]:
    """Enqueue once per order: a retried POST is the same job (also while draining)."""
    key = f"receipt:{order}"
    job = await store.enqueue("send-receipt", {"order": order}, idempotency_key=key)
    return {"job": job.id}


@app.get("/receipts")
async def receipts() -> list[str]:
    async with store.transaction() as conn:
        rows = await conn.execute("SELECT order_id FROM receipts ORDER BY order_id")
    return [order for (order,) in rows]  # SQLite: execute returns the rows, a list
