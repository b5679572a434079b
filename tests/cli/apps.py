"""Apps the CLI and ``serve`` tests run in real server processes.

``app`` carries its own runtime (built from the environment the tests set; the library reads
none); ``plain`` is a bare ASGI app that ``forgezero-lifecycle serve`` wraps in a runtime itself.
``/_test/counters`` is exempt from the gate, so tests can see a request is admitted before they
begin a drain, without sleeping.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from forgezero_lifecycle.asgi._types import Receive, Scope, Send
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.wire.handoff import StateImportContext

STATE_PROTOCOL = "tests.cli.counter"


class Count(BaseModel):
    count: int


class CounterState:
    """A tiny state adapter: a request counter the next generation takes over."""

    protocol = STATE_PROTOCOL
    schema_version = 1
    maximum_bytes = 1024
    model = Count

    def __init__(self) -> None:
        self.count = 0
        self.imported: int | None = None

    async def export_state(self) -> tuple[str, Count]:
        return f"count-{self.count}", Count(count=self.count)

    async def import_state(self, value: Count, context: StateImportContext) -> None:
        self.imported = value.count


def _exempt(scope: Scope) -> bool:
    path: str = scope["path"]
    return path.startswith("/_test/")


state = CounterState()
REVISION = os.environ.get("FORGEZERO_REVISION")
runtime = Runtime(
    control_token=os.environ["FORGEZERO_CONTROL_TOKEN"],
    handoff_token=os.environ.get("FORGEZERO_HANDOFF_TOKEN"),
    revision=REVISION,
    not_ready_grace=float(os.environ.get("FORGEZERO_NOT_READY_GRACE", "0")),
    state_adapter=state,
    exempt=_exempt,
)


async def fast(request: Request) -> Response:
    state.count += 1
    return JSONResponse({"ok": True})


async def slow(request: Request) -> Response:
    seconds = float(request.query_params.get("seconds", "1"))
    await asyncio.sleep(seconds)
    state.count += 1
    return JSONResponse({"slept": seconds})


#: Released by ``/_test/release``: what ``/held`` waits for (a request that lasts exactly as long
#: as a test needs, whatever the machine's load).
released = asyncio.Event()


async def held(request: Request) -> Response:
    await released.wait()
    state.count += 1
    return JSONResponse({"held": True})


async def release(request: Request) -> Response:
    released.set()
    return JSONResponse({"released": True})


async def stream(request: Request) -> Response:
    """A first chunk at once, the last one after ``seconds``: a response that spans a drain."""
    seconds = float(request.query_params.get("seconds", "1"))

    async def chunks() -> AsyncIterator[bytes]:
        yield b"first\n"
        await asyncio.sleep(seconds)
        yield b"last\n"

    return StreamingResponse(chunks(), media_type="text/plain")


async def counters(request: Request) -> Response:
    return JSONResponse({**runtime.in_flight().model_dump(), "imported": state.imported})


app = Starlette(
    routes=[
        Route("/fast", fast),
        Route("/slow", slow),
        Route("/held", held),
        Route("/stream", stream),
        Route("/_test/counters", counters),
        Route("/_test/release", release),
    ]
)
runtime.install(app)


#: An app whose runtime has fixed settings: it reads none of the variables ``serve`` exports.
fixed = Starlette(routes=[Route("/fast", fast)])
Runtime(control_token=os.environ["FORGEZERO_CONTROL_TOKEN"], revision=REVISION).install(fixed)


async def plain(scope: Scope, receive: Receive, send: Send) -> None:
    """A bare ASGI app with no runtime of its own (``serve`` wraps it)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    elif scope["type"] == "http":
        if scope["path"] == "/slow":
            await asyncio.sleep(1.0)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"plain"})
