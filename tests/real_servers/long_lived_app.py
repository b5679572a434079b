"""The app of the long-lived work tests: streams told in time, background work, a teardown.

Run as the user would (uvicorn, ``forgezero-lifecycle serve``, hypercorn in one process,
gunicorn's uvicorn worker). Beyond the control token and revision it reads::

    FORGEZERO_STREAM_GRACE            the runtime's stream_grace, in seconds
    FORGEZERO_SIGNAL_DRAIN_TIMEOUT    the signal drain's deadline, in seconds
    FORGEZERO_TEARDOWN_MARGIN         the runtime's teardown_margin, in seconds
    FORGEZERO_TEST_RECORD             a file each process appends what happened to, in order
    FORGEZERO_TEST_HANG_SHUTDOWN      "1": the lifespan shutdown never ends

``/sse`` waits on the drain notice and ends itself with a last event; ``/chunked`` and
``/sized`` (a declared Content-Length) never look at the drain, so the drain cuts them;
``/background?seconds=`` starts a task with ``runtime.create_task`` that records its end.
``/_test/...`` paths are exempt (never counted, never refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from forgezero_lifecycle.runtime import Runtime

from .app import TEST_PREFIX, _exempt

runtime = Runtime(
    control_token=os.environ["FORGEZERO_CONTROL_TOKEN"],
    revision=os.environ.get("FORGEZERO_REVISION"),
    stream_grace=float(os.environ.get("FORGEZERO_STREAM_GRACE", "0.3")),
    stream_notice_spread=0.0,
    signal_drain_timeout=float(os.environ.get("FORGEZERO_SIGNAL_DRAIN_TIMEOUT", "5")),
    teardown_margin=float(os.environ.get("FORGEZERO_TEARDOWN_MARGIN", "0.5")),
    exempt=_exempt,
)
RECORD = Path(os.environ["FORGEZERO_TEST_RECORD"])
LAST_EVENT = "retry: 100\nevent: draining\ndata: this generation stops\n\n"


def record(what: str) -> None:
    with RECORD.open("a") as file:
        file.write(f"{os.getpid()} {what}\n")


async def sse(request: Request) -> Response:
    notice = request.scope["extensions"]["forgezero.drain"]

    async def events() -> AsyncIterator[str]:
        told = asyncio.ensure_future(notice.wait())
        number = 0
        try:
            while not told.done():
                yield f"id: {number}\ndata: {number}\n\n"
                number += 1
                await asyncio.wait({told}, timeout=0.05)
            yield LAST_EVENT
        finally:
            told.cancel()

    return StreamingResponse(events(), media_type="text/event-stream")


async def endless() -> AsyncIterator[bytes]:
    number = 0
    while True:
        yield f"chunk {number}\n".encode()
        number += 1
        await asyncio.sleep(0.05)


async def chunked(request: Request) -> Response:
    return StreamingResponse(endless(), media_type="text/plain")


async def sized(request: Request) -> Response:
    return StreamingResponse(endless(), headers={"content-length": "100000000"})


async def background(request: Request) -> Response:
    seconds = float(request.query_params["seconds"])

    async def work() -> None:
        await asyncio.sleep(seconds)
        record("background done")

    runtime.create_task(work(), name="test-work")
    return JSONResponse({"started": True}, status_code=202)


async def process(request: Request) -> Response:
    return JSONResponse({"pid": os.getpid(), "in_flight": runtime.in_flight().model_dump()})


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    yield
    record("lifespan shutdown")
    if os.environ.get("FORGEZERO_TEST_HANG_SHUTDOWN") == "1":
        await asyncio.Event().wait()
    record("lifespan shutdown done")


app = Starlette(
    routes=[
        Route("/sse", sse),
        Route("/chunked", chunked),
        Route("/sized", sized),
        Route("/background", background),
        Route(TEST_PREFIX + "process", process),
    ],
    lifespan=lifespan,
)
runtime.install(app)
