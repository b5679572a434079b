"""The app of the signal tests: tests/real_servers/app.py's endpoints, its runtime's signal hook on.

Run as the user would (``uvicorn tests.real_servers.signal_app:app``, hypercorn, gunicorn). Beyond the
environment tests/real_servers/app.py reads::

    FORGEZERO_SIGNAL_DRAIN_TIMEOUT   the runtime's signal_drain_timeout, in seconds

The library's loggers are sent to stderr (an app's own logging setup: the library configures
none), and the app logs ``app.lifespan_shutdown`` when its lifespan shutdown runs, so a test can
read in the server's log which came first: the drain settling or the server's own stop.
``/_test/process`` (exempt) tells the worker's PID and which signals the hook wraps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from forgezero_lifecycle.runtime import Runtime

from .app import TEST_PREFIX, _exempt, echo, fast, slow

_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
_library = logging.getLogger("forgezero_lifecycle")
_library.addHandler(_handler)
_library.setLevel(logging.INFO)
_library.propagate = False

runtime = Runtime(
    control_token=os.environ["FORGEZERO_CONTROL_TOKEN"],
    revision=os.environ.get("FORGEZERO_REVISION"),
    stream_grace=float(os.environ.get("FORGEZERO_STREAM_GRACE", "0.5")),
    signal_drain_timeout=float(os.environ.get("FORGEZERO_SIGNAL_DRAIN_TIMEOUT", "30")),
    exempt=_exempt,
)


async def counters(request: Request) -> Response:
    return JSONResponse(runtime.in_flight().model_dump())


async def process(request: Request) -> Response:
    return JSONResponse({"pid": os.getpid(), "hooked": list(runtime.signal_drain.hooked)})


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    yield
    print("app.lifespan_shutdown", file=sys.stderr, flush=True)


app = Starlette(
    routes=[
        Route("/fast", fast),
        Route("/slow", slow),
        WebSocketRoute("/ws", echo),
        Route(TEST_PREFIX + "counters", counters),
        Route(TEST_PREFIX + "process", process),
    ],
    lifespan=lifespan,
)
runtime.install(app)
