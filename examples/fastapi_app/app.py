"""A FastAPI service that hands over to its next generation with nothing lost.

Run it (see README.md for the drain, rollback and handoff commands)::

    FORGEZERO_CONTROL_TOKEN=... uvicorn examples.fastapi_app.app:app

The app reads its settings from the environment itself; the library reads none::

    FORGEZERO_CONTROL_TOKEN   bearer token of the control plane (required, ≥ 16 characters)
    FORGEZERO_HANDOFF_TOKEN   bearer token of the state export (43 URL-safe characters; optional)
    FORGEZERO_REVISION        this generation's revision, 40 lowercase hex (optional: when set,
                              a drain whose sourceRevision differs is refused)
    FORGEZERO_STREAM_GRACE    seconds open streams and WebSockets get before the drain ends them
    FORGEZERO_NOT_READY_GRACE seconds readiness is off before intake closes (the endpoint race;
                              `forgezero-lifecycle serve --not-ready-grace` sets it)

    FORGEZERO_JOBS_DB         SQLite file of the durable jobs (default forgezero-example-jobs.sqlite3;
                              both generations must share it)
    FORGEZERO_JOBS_DSN        a postgresql:// DSN instead of SQLite

Endpoints: ``/hello`` (fast, counts visits), ``/slow?seconds=``, ``/stream`` (server-sent
events that end by themselves once a drain begins), ``/echo`` (WebSocket), ``POST /orders``
(enqueues a durable job), ``GET /jobs/{id}``, ``POST /ledger/{user}`` (per-user serial work on
the keyed queue), and the control plane under ``/.forgezero/runtime/``. The visit count is the
state handed to the next generation; see work.py for the jobs, queue and scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Final

from fastapi import FastAPI, HTTPException, Query, WebSocket, WebSocketDisconnect
from pydantic import BaseModel
from starlette.responses import StreamingResponse

from forgezero_lifecycle import Runtime, StateImportContext

from .work import Work

# -- settings --------------------------------------------------------------------------------


def _setting(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name, default)
    return value or None


CONTROL_TOKEN: Final = _setting("FORGEZERO_CONTROL_TOKEN")
if CONTROL_TOKEN is None:
    raise RuntimeError(
        "set FORGEZERO_CONTROL_TOKEN, e.g. "
        'export FORGEZERO_CONTROL_TOKEN=$(python -c "import secrets; print(secrets.token_urlsafe(32))")'
    )
HANDOFF_TOKEN: Final = _setting("FORGEZERO_HANDOFF_TOKEN")
REVISION: Final = _setting("FORGEZERO_REVISION")
STREAM_GRACE: Final = float(_setting("FORGEZERO_STREAM_GRACE", "5") or 5)
NOT_READY_GRACE: Final = float(_setting("FORGEZERO_NOT_READY_GRACE", "0") or 0)


# -- state handed to the next generation ----------------------------------------------------


class Visits(BaseModel):
    """The handoff value: typed, versioned, and nothing secret in it."""

    count: int


class VisitCounter:
    """The app's state, and its state adapter (a ``forgezero_lifecycle.StateAdapter``)."""

    protocol = "example.visits"
    schema_version = 1
    maximum_bytes = 1024
    model = Visits

    def __init__(self) -> None:
        self.count = 0

    async def export_state(self) -> tuple[str, Visits]:
        # The cursor names the exact point the export reflects; the new generation echoes it.
        return f"visits-{self.count}", Visits(count=self.count)

    async def import_state(self, value: Visits, context: StateImportContext) -> None:
        self.count += value.count


visits = VisitCounter()

# -- the runtime: drain, rollback and handoff for this generation ---------------------------

runtime = Runtime(
    control_token=CONTROL_TOKEN,
    handoff_token=HANDOFF_TOKEN,
    revision=REVISION,
    state_adapter=visits,
    stream_grace=STREAM_GRACE,
    not_ready_grace=NOT_READY_GRACE,
)

work = Work()

# -- the app --------------------------------------------------------------------------------


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    await work.start(runtime)
    try:
        yield
    finally:
        await work.stop()
        await runtime.aclose()


app = FastAPI(title="forgezero-lifecycle FastAPI example", lifespan=lifespan)


class Order(BaseModel):
    user: str
    order: str


@app.post("/orders", status_code=202)
async def place_order(order: Order) -> dict[str, int]:
    """Enqueue the receipt as a durable job (also while draining: the next generation runs it)."""
    return {"job": await work.enqueue_receipt(order.user, order.order)}


@app.get("/jobs/{job_id}")
async def job_status(job_id: int) -> dict[str, object]:
    status = await work.job(job_id)
    if status is None:
        raise HTTPException(404, "no such job")
    return status


@app.post("/ledger/{user}")
async def append_to_ledger(user: str, entry: Annotated[str, Query(max_length=200)]) -> list[str]:
    """Per-user serial work: one user's entries apply in order, users run in parallel."""
    return await work.append_to_ledger(user, entry)


@app.get("/hello")
async def hello() -> dict[str, object]:
    """A fast endpoint; every call is one more visit."""
    visits.count += 1
    return {"hello": "world", "visits": visits.count}


@app.get("/slow")
async def slow(seconds: Annotated[float, Query(ge=0, le=60)] = 2.0) -> dict[str, float]:
    """A slow endpoint: admitted before a drain, it still runs to its end."""
    await asyncio.sleep(seconds)
    return {"slept": seconds}


@app.get("/stream")
async def stream(
    events: Annotated[int, Query(ge=1, le=1000)] = 10,
    interval: Annotated[float, Query(ge=0, le=10)] = 0.5,
) -> StreamingResponse:
    """Server-sent events that end cooperatively, with a last event, once a drain begins."""
    return StreamingResponse(_ticks(events, interval), media_type="text/event-stream")


async def _ticks(events: int, interval: float) -> AsyncIterator[str]:
    for index in range(events):
        yield f"data: tick {index}\n\n"
        if index + 1 < events and await _draining_within(interval):
            yield "event: draining\ndata: reconnect\n\n"
            return


async def _draining_within(seconds: float) -> bool:
    """Wait up to ``seconds``; True as soon as a drain has begun."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await runtime.draining.wait()
    return runtime.draining.is_set()


@app.websocket("/echo")
async def echo(websocket: WebSocket) -> None:
    """Echo text messages; a drain closes the session with 1012 after the stream grace."""
    await websocket.accept()
    with contextlib.suppress(WebSocketDisconnect):
        while True:
            await websocket.send_text(await websocket.receive_text())


runtime.install(app)
