"""Server-sent events that end in time: a last event at the drain notice, then a reconnect.

Run it under any server (the runtime drains on SIGTERM under each)::

    FORGEZERO_CONTROL_TOKEN=... forgezero-lifecycle serve examples.sse.app:app --workers 2
    FORGEZERO_CONTROL_TOKEN=... uvicorn examples.sse.app:app
    FORGEZERO_CONTROL_TOKEN=... hypercorn examples.sse.app:app

``/ticks`` (Starlette's ``StreamingResponse``) and ``/ticks-sse-starlette`` (sse-starlette's
``EventSourceResponse``) send one numbered event every ``SSE_INTERVAL`` seconds, from the one
after the client's ``Last-Event-ID``. Each handler waits on the drain notice,
``scope["extensions"]["forgezero.drain"]``: when this request's turn comes (after the not-ready
and stream graces, at its place in the notice's spread) it sends a last event, ``retry:`` and
``event: draining``, and ends the stream cleanly. The browser's ``EventSource`` (or any SSE
client) reconnects after ``retry`` milliseconds with ``Last-Event-ID`` and lands on the next
generation, which goes on from the next event: none is lost across a handover (``SIGHUP`` to
``serve --workers 2``) or a stop.

Settings the app reads itself (the library reads none)::

    FORGEZERO_CONTROL_TOKEN   bearer token of the control plane (required, ≥ 16 characters)
    FORGEZERO_REVISION        this generation's revision, 40 lowercase hex (optional)
    FORGEZERO_STREAM_GRACE    seconds streams keep going once intake closed (default 5)
    SSE_INTERVAL              seconds between two events (default 1)
    SSE_RETRY_MS              the reconnect delay the last event asks for (default 500)
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Final

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from forgezero_lifecycle import Runtime

runtime = Runtime(
    control_token=os.environ["FORGEZERO_CONTROL_TOKEN"],
    revision=os.environ.get("FORGEZERO_REVISION") or None,
    stream_grace=float(os.environ.get("FORGEZERO_STREAM_GRACE", "5")),
)
INTERVAL: Final = float(os.environ.get("SSE_INTERVAL", "1"))
RETRY_MS: Final = int(os.environ.get("SSE_RETRY_MS", "500"))
#: Says why the stream ends; the data names this process, so a client can see the handover.
LAST_EVENT: Final = "draining"


def first_event(request: Request) -> int:
    """The number of the first event to send: the one after the client's Last-Event-ID."""
    last = request.headers.get("last-event-id", "")
    return int(last) + 1 if last.isdigit() else 0


async def numbered(request: Request) -> AsyncIterator[tuple[int, bool]]:
    """(number, last) pairs, one every INTERVAL; ``last`` once this request's notice came."""
    notice = request.scope["extensions"]["forgezero.drain"]
    told = asyncio.ensure_future(notice.wait())
    try:
        number = first_event(request)
        while True:
            yield number, False
            number += 1
            done, _ = await asyncio.wait({told}, timeout=INTERVAL)
            if done:
                yield number, True
                return
    finally:
        told.cancel()


async def ticks(request: Request) -> Response:
    """The stream, written out by hand: ``id:`` and ``data:`` lines per event."""

    async def body() -> AsyncIterator[str]:
        async for number, last in numbered(request):
            if last:
                yield f"retry: {RETRY_MS}\nevent: {LAST_EVENT}\ndata: pid {os.getpid()}\n\n"
            else:
                yield f"id: {number}\ndata: {number} pid {os.getpid()}\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


async def ticks_sse_starlette(request: Request) -> Response:
    """The same stream through sse-starlette's EventSourceResponse."""

    async def events() -> AsyncIterator[ServerSentEvent]:
        async for number, last in numbered(request):
            if last:
                yield ServerSentEvent(f"pid {os.getpid()}", event=LAST_EVENT, retry=RETRY_MS)
            else:
                yield ServerSentEvent(f"{number} pid {os.getpid()}", id=str(number))

    return EventSourceResponse(events())


app = Starlette(routes=[Route("/ticks", ticks), Route("/ticks-sse-starlette", ticks_sse_starlette)])
runtime.install(app)
