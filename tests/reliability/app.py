"""One generation of the service the reliability tests hand over; it records all the work it runs.

Configured from the environment the tests set (the library itself reads none)::

    FORGEZERO_CONTROL_TOKEN / FORGEZERO_HANDOFF_TOKEN / FORGEZERO_REVISION
    FZREL_GENERATION     this generation's label, echoed in every response
    FZREL_RECORDS        file this generation appends its records to (one line per event)
    FZREL_STREAM_GRACE   seconds before open streams and WebSockets get the drain notice
    FZREL_BARE           "1": no Runtime at all (the plain-uvicorn anchor)
    FZREL_EXPORT_DELAY   seconds the state export waits (holds a handoff in mid-flight)
    FZREL_JOBS           SQLite file or PostgreSQL DSN of the durable job store (optional)
    FZREL_JOBS_SCHEMA    PostgreSQL schema of the job store
    FZREL_JOB_SECONDS    how long a job's handler works before it commits
    FZREL_JOB_LEASE      the worker's lease, seconds
    FZREL_STARTUP_DELAY  seconds the lifespan startup takes (a slow app's start-up)
    FZREL_SIGNAL_DRAIN   the runtime's signal_drain_timeout, seconds (default 30)

Records (``FZREL_RECORDS``), written with one unbuffered ``write`` each, so a SIGKILL loses none::

    S <request id> <monotonic>     a request was admitted and the handler began
    F <request id> <monotonic>     its handler finished (a stream: after the last chunk)
    J <job id> <fence> <monotonic> a durable job's handler began
    C <job id> <fence> <monotonic> its completion (and its effect row) committed

``/_rel/`` is exempt from the gate (the tests' view of the generation). Monotonic times are the
system-wide clock, comparable with the test process's ``time.monotonic()``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from forgezero_lifecycle.asgi._types import Scope
from forgezero_lifecycle.jobs import JobWorker, Lease, SQLiteJobStore
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.wire.handoff import StateImportContext

from ._constants import STATE_MAXIMUM_BYTES, STATE_PROTOCOL

GENERATION = os.environ.get("FZREL_GENERATION", "g0")
#: The records file of each process, opened at its first record: ``{pid}`` in the path becomes
#: the process's PID (a worker forked by ``serve --preload`` has its own, though the module was
#: imported once, before the fork).
_RECORDS: dict[int, int] = {}


def record(*fields: object) -> None:
    pid = os.getpid()
    fd = _RECORDS.get(pid)
    if fd is None:
        path = os.environ.get("FZREL_RECORDS", os.devnull).replace("{pid}", str(pid))
        fd = _RECORDS[pid] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (" ".join(map(str, (*fields, time.monotonic()))) + "\n").encode())


class Served(BaseModel):
    """The handed-over state: how many requests the generations so far have completed."""

    served: int
    chain: list[str]


class ServedState:
    """The state adapter: exported by a draining generation, imported by the next one."""

    protocol = STATE_PROTOCOL
    schema_version = 1
    maximum_bytes = STATE_MAXIMUM_BYTES
    model = Served

    def __init__(self) -> None:
        self.served = 0
        self.exporting = 0
        self.imported: Served | None = None
        self.export_delay = float(os.environ.get("FZREL_EXPORT_DELAY", "0"))

    async def export_state(self) -> tuple[str, Served]:
        self.exporting += 1
        try:
            await asyncio.sleep(self.export_delay)
            chain = [*(self.imported.chain if self.imported else []), GENERATION]
            base = self.imported.served if self.imported else 0
            return f"served-{self.served}", Served(served=base + self.served, chain=chain)
        finally:
            self.exporting -= 1

    async def import_state(self, value: Served, context: StateImportContext) -> None:
        self.imported = value


def _exempt(scope: Scope) -> bool:
    path: str = scope["path"]
    return path.startswith("/_rel/")


def _peak_memory_kib() -> dict[str, int]:
    """VmHWM (peak resident) and VmRSS of this process, from /proc."""
    found: dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmHWM", "VmRSS"):
                found[name] = int(value.split()[0])
    return found


state = ServedState()
bare = os.environ.get("FZREL_BARE") == "1"
runtime: Runtime | None = None
if not bare:
    runtime = Runtime(
        control_token=os.environ["FORGEZERO_CONTROL_TOKEN"],
        handoff_token=os.environ.get("FORGEZERO_HANDOFF_TOKEN"),
        revision=os.environ.get("FORGEZERO_REVISION"),
        state_adapter=state,
        stream_grace=float(os.environ.get("FZREL_STREAM_GRACE", "2.0")),
        signal_drain_timeout=float(os.environ.get("FZREL_SIGNAL_DRAIN", "30")),
        exempt=_exempt,
    )
workers: list[JobWorker[Any]] = []


def _request_id(request: Request) -> str:
    return request.headers.get("x-request-id", "-")


def _finish(request_id: str) -> None:
    state.served += 1
    record("F", request_id)


async def fast(request: Request) -> Response:
    """``?cpu_ms=N``: the handler first keeps the CPU busy for N ms (a worker that is busy
    accepts nothing meanwhile, as under a CPU-bound app)."""
    request_id = _request_id(request)
    record("S", request_id)
    busy_until = time.perf_counter() + float(request.query_params.get("cpu_ms", "0")) / 1000
    while time.perf_counter() < busy_until:
        pass
    _finish(request_id)
    return JSONResponse({"id": request_id, "gen": GENERATION})


async def slow(request: Request) -> Response:
    request_id = _request_id(request)
    record("S", request_id)
    await asyncio.sleep(float(request.query_params.get("ms", "300")) / 1000)
    _finish(request_id)
    return JSONResponse({"id": request_id, "gen": GENERATION})


async def stream(request: Request) -> Response:
    request_id = _request_id(request)
    record("S", request_id)
    chunks = int(request.query_params.get("chunks", "5"))
    interval = float(request.query_params.get("ms", "40")) / 1000

    async def body() -> AsyncIterator[bytes]:
        for index in range(chunks):
            await asyncio.sleep(interval)
            yield f"{GENERATION} chunk {index}\n".encode()
        yield b"end\n"
        _finish(request_id)

    return StreamingResponse(body(), media_type="text/plain")


async def submit(request: Request) -> Response:
    """A POST whose body must arrive whole: its digest is checked against the client's."""
    request_id = _request_id(request)
    record("S", request_id)
    body = await request.body()
    digest = hashlib.sha256(body).hexdigest()
    if digest != request.headers.get("x-body-sha256"):
        record("B", request_id)  # a body that arrived damaged
        return JSONResponse({"id": request_id, "error": "body digest mismatch"}, 400)
    _finish(request_id)
    return JSONResponse({"id": request_id, "gen": GENERATION, "sha256": digest})


async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_text(f"hello {GENERATION}")
    try:
        while True:
            await websocket.send_text(await websocket.receive_text())
    except WebSocketDisconnect:
        pass


async def push(websocket: WebSocket) -> None:
    """Server push: a tick every ``ms`` (100) milliseconds, whatever the client does, padded to
    ``size`` bytes (``?size=65536&ms=0`` fills a non-reading client's buffers at once); the
    client's messages are never read."""
    await websocket.accept()
    interval = float(websocket.query_params.get("ms", "100")) / 1000
    padding = "." * int(websocket.query_params.get("size", "0"))
    tick = 0
    while True:
        tick += 1
        await websocket.send_text(f"{GENERATION} tick {tick}{padding}")
        await asyncio.sleep(interval)


async def stats(request: Request) -> Response:
    counts = [worker.statistics() for worker in workers]
    return JSONResponse(
        {
            "gen": GENERATION,
            "served": state.served,
            "exporting": state.exporting,
            "imported": None if state.imported is None else state.imported.model_dump(),
            "inFlight": None if runtime is None else runtime.in_flight().model_dump(),
            "memoryKiB": _peak_memory_kib(),
            "jobs": {
                "claimed": sum(c.claimed for c in counts),
                "completed": sum(c.completed for c in counts),
                "released": sum(c.released for c in counts),
                "lost": sum(c.lost for c in counts),
            },
        }
    )


async def live(request: Request) -> Response:
    """The bare anchor's liveness route (a runtime serves its own)."""
    return JSONResponse({"live": True})


async def _open_store(target: str) -> tuple[Any, str]:
    if target.startswith("postgres"):
        from forgezero_lifecycle.jobs.postgres import PostgresJobStore

        schema = os.environ.get("FZREL_JOBS_SCHEMA", "forgezero")
        pg = PostgresJobStore(target, schema=schema, max_size=4)
        await pg.open()
        async with pg.transaction() as conn:
            await conn.execute(
                f'CREATE TABLE IF NOT EXISTS "{schema}".app_effects '
                "(job_id bigint NOT NULL, fence bigint NOT NULL, gen text NOT NULL)"
            )
        return pg, f'INSERT INTO "{schema}".app_effects (job_id, fence, gen) VALUES (%s, %s, %s)'
    lite = SQLiteJobStore(target)
    await lite.open()
    async with lite.transaction() as tx:
        await tx.execute(
            "CREATE TABLE IF NOT EXISTS app_effects "
            "(job_id INTEGER NOT NULL, fence INTEGER NOT NULL, gen TEXT NOT NULL)"
        )
    return lite, "INSERT INTO app_effects (job_id, fence, gen) VALUES (?, ?, ?)"


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    await asyncio.sleep(float(os.environ.get("FZREL_STARTUP_DELAY", "0")))
    target = os.environ.get("FZREL_JOBS")
    if not target:
        yield
        return
    store, insert = await _open_store(target)
    seconds = float(os.environ.get("FZREL_JOB_SECONDS", "0.05"))
    worker: JobWorker[Any] = JobWorker(
        store,
        concurrency=4,
        lease=float(os.environ.get("FZREL_JOB_LEASE", "2")),
        owner=f"{GENERATION}:{os.getpid()}",
        idle_interval=0.1,
        release_margin=0.3,
    )

    @worker.handler("work")
    async def work(lease: Lease[Any]) -> None:
        record("J", lease.job.id, lease.fence)
        await asyncio.sleep(seconds)
        async with lease.commit({"by": GENERATION}) as conn:
            await conn.execute(insert, (lease.job.id, lease.fence, GENERATION))
        record("C", lease.job.id, lease.fence)

    if runtime is not None:
        runtime.add(worker)
    worker.start()
    workers.append(worker)
    try:
        yield
    finally:
        await worker.stop(timeout=1.0)
        await store.close()


routes = [
    Route("/fast", fast),
    Route("/slow", slow),
    Route("/stream", stream),
    Route("/submit", submit, methods=["POST"]),
    WebSocketRoute("/ws", echo),
    WebSocketRoute("/ws/push", push),
    Route("/_rel/stats", stats),
]
if bare:
    routes.append(Route("/.forgezero/runtime/live", live))
app = Starlette(routes=routes, lifespan=lifespan)
if runtime is not None:
    runtime.install(app)
