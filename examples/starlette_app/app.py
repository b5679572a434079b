"""A Starlette service that hands over to its next generation with nothing lost.

Run it (see README.md for the drain, rollback and handoff commands)::

    FORGEZERO_CONTROL_TOKEN=... uvicorn examples.starlette_app.app:app

The app reads its settings from the environment itself; the library reads none::

    FORGEZERO_CONTROL_TOKEN   bearer token of the control plane (required, ≥ 16 characters)
    FORGEZERO_HANDOFF_TOKEN   bearer token of the state export (43 URL-safe characters; optional)
    FORGEZERO_REVISION        this generation's revision, 40 lowercase hex (optional: when set,
                              a drain whose sourceRevision differs is refused)
    FORGEZERO_STREAM_GRACE    seconds open streams and WebSockets get before the drain ends them
    FORGEZERO_NOT_READY_GRACE seconds readiness is off before intake closes (the endpoint race;
                              `forgezero-lifecycle serve --not-ready-grace` sets it)

Endpoints: ``/hello`` (fast, counts visits), ``/slow?seconds=``, ``/stream`` (lines that end
by themselves once a drain begins), ``/echo`` (WebSocket), and the control plane under
``/.forgezero/runtime/``. The visit count is the state handed to the next generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Final

from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from forgezero_lifecycle import Runtime, StateImportContext

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

# -- endpoints ------------------------------------------------------------------------------


async def hello(request: Request) -> Response:
    """A fast endpoint; every call is one more visit."""
    visits.count += 1
    return JSONResponse({"hello": "world", "visits": visits.count})


async def slow(request: Request) -> Response:
    """A slow endpoint: admitted before a drain, it still runs to its end."""
    seconds = _number(request, "seconds", 2.0, high=60)
    await asyncio.sleep(seconds)
    return JSONResponse({"slept": seconds})


async def stream(request: Request) -> Response:
    """Lines of text that end cooperatively, with a last line, once a drain begins."""
    lines = int(_number(request, "lines", 10, high=1000))
    interval = _number(request, "interval", 0.5, high=10)
    return StreamingResponse(_lines(lines, interval), media_type="text/plain")


async def _lines(lines: int, interval: float) -> AsyncIterator[str]:
    for index in range(lines):
        yield f"line {index}\n"
        if index + 1 < lines and await _draining_within(interval):
            yield "draining: reconnect for the rest\n"
            return


async def _draining_within(seconds: float) -> bool:
    """Wait up to ``seconds``; True as soon as a drain has begun."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await runtime.draining.wait()
    return runtime.draining.is_set()


async def echo(websocket: WebSocket) -> None:
    """Echo text messages; a drain closes the session with 1012 after the stream grace."""
    await websocket.accept()
    with contextlib.suppress(WebSocketDisconnect):
        while True:
            await websocket.send_text(await websocket.receive_text())


def _number(request: Request, name: str, default: float, *, high: float) -> float:
    raw = request.query_params.get(name)
    try:
        value = default if raw is None else float(raw)
    except ValueError:
        raise HTTPException(400, f"{name} must be a number") from None
    if not 0 <= value <= high:
        raise HTTPException(400, f"{name} must be between 0 and {high}")
    return value


# -- the app --------------------------------------------------------------------------------

app = Starlette(
    routes=[
        Route("/hello", hello),
        Route("/slow", slow),
        Route("/stream", stream),
        WebSocketRoute("/echo", echo),
    ]
)
runtime.install(app)
