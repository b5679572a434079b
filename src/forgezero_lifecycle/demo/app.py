"""The demo's app: one generation of a small service with HTTP, streams, WebSockets and jobs.

Run by the demo as ``forgezero-lifecycle serve forgezero_lifecycle.demo.app:app``, configured
from the environment (the library reads none; an app may)::

    FORGEZERO_CONTROL_TOKEN / FORGEZERO_HANDOFF_TOKEN   the control plane's tokens
    FORGEZERO_REVISION                                  this generation's revision
    FORGEZERO_DEMO_GENERATION                           a label: "A" or "B"
    FORGEZERO_DEMO_JOBS                                 SQLite file or PostgreSQL DSN (optional)
    FORGEZERO_DEMO_SCHEMA                               PostgreSQL schema of the job store
    FORGEZERO_DEMO_CLAIM                                "now" or "later" (POST /_demo/claim)
    FORGEZERO_DEMO_STREAM_GRACE                         seconds before streams get the notice

Its handoff state is a visit counter (:mod:`.state`). ``/_demo/*`` is exempt from the gate (the
orchestrator's view). Everything lives in :func:`create_app`; the module holds only ``app``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..asgi._types import Scope
from ..jobs import JobWorker, Lease
from ..runtime import Runtime
from .jobs import WORK_QUEUE, ZOMBIE_QUEUE, open_store, record_effect
from .state import DemoState

__all__ = ["app", "create_app"]

#: The worker's lease: short, so a frozen worker's job is reclaimed within the demo.
JOB_LEASE: Final = 3.0


def _exempt(scope: Scope) -> bool:
    path: str = scope["path"]
    return path.startswith("/_demo/")


def create_app(environ: dict[str, str] | None = None) -> Starlette:
    """One generation of the demo app, configured from ``environ`` (default: ``os.environ``)."""
    env = dict(os.environ if environ is None else environ)
    generation = env.get("FORGEZERO_DEMO_GENERATION", "A")
    state = DemoState(generation)
    runtime = Runtime(
        control_token=env.get("FORGEZERO_CONTROL_TOKEN"),
        handoff_token=env.get("FORGEZERO_HANDOFF_TOKEN"),
        revision=env.get("FORGEZERO_REVISION"),
        state_adapter=state,
        stream_grace=float(env.get("FORGEZERO_DEMO_STREAM_GRACE", "1.0")),
        exempt=_exempt,
    )
    workers: list[JobWorker[Any]] = []

    async def start_jobs(target: str) -> Any:
        store = await open_store(target, env.get("FORGEZERO_DEMO_SCHEMA") or None)
        worker: JobWorker[Any] = JobWorker(store, concurrency=8, lease=JOB_LEASE, idle_interval=0.2)

        async def work(lease: Lease[Any]) -> dict[str, str]:
            await asyncio.sleep(float(lease.job.payload.get("seconds", 0.1)))
            async with lease.commit({"by": generation}) as conn:
                await record_effect(store, conn, lease.job.id, generation, lease.fence)
            return {"by": generation}

        worker.handler(WORK_QUEUE)(work)
        worker.handler(ZOMBIE_QUEUE)(work)
        if env.get("FORGEZERO_DEMO_CLAIM", "now") != "now":
            worker.pause_intake()  # a new generation claims only once the handoff is done
        runtime.add(worker)
        worker.start()
        workers.append(worker)
        return store

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        target = env.get("FORGEZERO_DEMO_JOBS")
        store = await start_jobs(target) if target else None
        try:
            yield
        finally:
            for worker in workers:
                await worker.stop(timeout=1.0)
            if store is not None:
                await store.close()

    async def fast(request: Request) -> Response:
        return JSONResponse({"generation": generation, "visits": state.visit()})

    async def slow(request: Request) -> Response:
        await asyncio.sleep(float(request.query_params.get("ms", "500")) / 1000)
        return JSONResponse({"generation": generation, "visits": state.visit()})

    async def stream(request: Request) -> Response:
        chunks = int(request.query_params.get("chunks", "5"))
        interval = float(request.query_params.get("ms", "60")) / 1000

        async def body() -> AsyncIterator[bytes]:
            for index in range(chunks):
                await asyncio.sleep(interval)
                yield f"{generation} chunk {index}\n".encode()
            yield b"end\n"

        return StreamingResponse(body(), media_type="text/plain")

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(f"hello from {generation}")
        try:
            while True:
                await websocket.send_text(await websocket.receive_text())
        except WebSocketDisconnect:
            pass

    async def stats(request: Request) -> Response:
        counts = [worker.statistics() for worker in workers]
        return JSONResponse(
            {
                "generation": generation,
                "visits": state.by,
                "importedFrom": state.imported_from,
                "inFlight": runtime.in_flight().model_dump(),
                "jobs": {
                    "claimed": sum(c.claimed for c in counts),
                    "released": sum(c.released for c in counts),
                    "lost": sum(c.lost for c in counts),
                },
            }
        )

    async def claim(request: Request) -> Response:
        for worker in workers:
            worker.resume_intake()
        return JSONResponse({"claiming": bool(workers)})

    app = Starlette(
        routes=[
            Route("/fast", fast),
            Route("/slow", slow),
            Route("/stream", stream),
            WebSocketRoute("/ws", echo),
            Route("/_demo/stats", stats),
            Route("/_demo/claim", claim, methods=["POST"]),
        ],
        lifespan=lifespan,
    )
    runtime.install(app)
    return app


app = create_app()
