"""The app ``serve --workers`` tests run: every worker keeps its own records, one file per PID.

Configured from the environment the tests set (the library reads none)::

    FORGEZERO_CONTROL_TOKEN / FORGEZERO_REVISION    the runtime's token and revision
    FZW_RECORDS     directory; each worker appends to ``<pid>.log`` (one unbuffered write a line)
    FZW_MODE_FILE   read at import: ``crash`` raises on import, ``hang-import`` never finishes
                    its import, ``hang`` never finishes startup, ``slow-stop`` takes 4 s in
                    its lifespan shutdown (then records ``shutdown done``);
                    ``stagger``: the first worker of a generation to start (it creates
                    ``<mode file>.first``) is ready at once, the others 3 s later;
                    ``one-fails``: the first is ready at once, the others fail their startup
                    3.5 s later

``/slow`` sleeps ``seconds``, or waits until the file ``until`` exists in ``FZW_RECORDS``.
``/busy`` spends about 1 ms of CPU and answers the worker's PID (not recorded).

Records: ``started``, ``draining``, ``settled <state>`` (drained, failed, rolled-back),
``resumed`` (after a rollback) and
``admitted <path>`` for every counted request, each followed by the monotonic time.
``/_w/`` is exempt from the gate (the tests' view of one worker).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from forgezero_lifecycle.asgi._types import Scope
from forgezero_lifecycle.core.scheduler import Scheduler, SchedulerParticipant
from forgezero_lifecycle.runtime import Runtime

_MODE_FILE = os.environ.get("FZW_MODE_FILE")
MODE = Path(_MODE_FILE).read_text().strip() if _MODE_FILE and Path(_MODE_FILE).exists() else "ok"
if MODE == "crash":
    raise RuntimeError("this generation crashes on import (FZW_MODE_FILE says so)")
while MODE == "hang-import":
    time.sleep(3600)  # until the supervisor kills it

#: The records file of this process, by PID: a worker forked by ``serve --preload`` (which
#: imported this module once, in the preload process) opens its own at its first record.
_RECORDS: dict[int, int] = {}


def record(*fields: object) -> None:
    pid = os.getpid()
    fd = _RECORDS.get(pid)
    if fd is None:
        fd = _RECORDS[pid] = os.open(
            os.path.join(os.environ.get("FZW_RECORDS", "/tmp"), f"{pid}.log"),
            os.O_WRONLY | os.O_APPEND | os.O_CREAT,
            0o644,
        )
    os.write(fd, (" ".join(map(str, (*fields, time.monotonic()))) + "\n").encode())


def _exempt(scope: Scope) -> bool:
    path: str = scope["path"]
    return path.startswith("/_w/")


runtime = Runtime(
    control_token=os.environ["FORGEZERO_CONTROL_TOKEN"],
    revision=os.environ.get("FORGEZERO_REVISION"),
    exempt=_exempt,
)
scheduler = Scheduler()
runtime.add(SchedulerParticipant(scheduler))


@scheduler.job(every=3600)
async def hourly() -> None:
    """A schedule every worker has (so a generation's status lists it once per worker)."""


async def _follow_drains() -> None:
    while True:
        await runtime.draining.wait()
        record("draining")
        state = await runtime.drain.wait()
        record("settled", state)
        while runtime.draining.is_set():  # noqa: ASYNC110 - until a rollback clears it
            await asyncio.sleep(0.01)
        record("resumed")


def _first() -> bool:
    """This worker is the first of its generation to start (``<mode file>.first`` is new)."""
    try:
        os.close(os.open(f"{_MODE_FILE}.first", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    if MODE == "hang":
        await asyncio.Event().wait()
    if MODE == "stagger" and not _first():
        await asyncio.sleep(3.0)
    if MODE == "one-fails" and not _first():
        await asyncio.sleep(3.5)
        raise RuntimeError("this worker fails its startup (FZW_MODE_FILE says one-fails)")
    follower = asyncio.create_task(_follow_drains())
    scheduler.start()
    record("started")
    try:
        yield
    finally:
        follower.cancel()
        await scheduler.stop(timeout=1.0)
        if MODE == "slow-stop":
            # The behaviour under test: a 4 s application shutdown that a stale stop timer
            # (3 s) must not cut (test_stop_after_replacement_missed_its_start).
            await asyncio.sleep(4.0)
            record("shutdown done")


async def pid(request: Request) -> Response:
    record("admitted", "/pid")
    return JSONResponse({"pid": os.getpid(), "revision": runtime.revision})


async def slow(request: Request) -> Response:
    """``seconds`` long (default 1), or, with ``until=NAME``, until the file NAME exists in the
    records directory (a request held exactly as long as a test needs, on any machine)."""
    record("admitted", "/slow")
    until = request.query_params.get("until")
    if until is None:
        await asyncio.sleep(float(request.query_params.get("seconds", "1")))
    else:
        released = Path(os.environ.get("FZW_RECORDS", "/tmp"), until)
        # Polled: the test, another process, makes the file, and no event crosses processes;
        # a stat takes microseconds, so the blocking call (ASYNC240) costs the loop nothing.
        while not released.exists():  # noqa: ASYNC110, ASYNC240
            await asyncio.sleep(0.02)
    return JSONResponse({"pid": os.getpid()})


async def busy(request: Request) -> Response:
    """About 1 ms of CPU, then this worker's PID (a CPU-bound handler)."""
    until = time.process_time() + 0.001
    while time.process_time() < until:  # busy on purpose: the CPU is the bottleneck
        pass
    return JSONResponse({"pid": os.getpid()})


async def me(request: Request) -> Response:
    return JSONResponse({"pid": os.getpid(), **runtime.in_flight().model_dump()})


app = Starlette(
    routes=[
        Route("/pid", pid),
        Route("/slow", slow),
        Route("/busy", busy),
        Route("/_w/me", me),
    ],
    lifespan=lifespan,
)
runtime.install(app)


def create_app() -> Starlette:
    """The app through a factory (``serve tests.serve.apps:create_app --factory``)."""
    return app
