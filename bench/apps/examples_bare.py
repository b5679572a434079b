"""The two examples' apps without the runtime: the bare side of ``bench.memory``.

``examples/starlette_app/app.py`` and ``examples/fastapi_app/app.py`` with the same endpoints
(``/hello`` counting visits, ``/slow``, ``/stream``, the ``/echo`` WebSocket) and nothing from
``forgezero_lifecycle``: no runtime, no control plane, no state adapter, so nothing of the
library is imported. Factories (``uvicorn --factory bench.apps.examples_bare:starlette``), so a
process imports only the framework it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Any


class _Visits:
    count = 0


async def _lines(lines: int, interval: float) -> AsyncIterator[str]:
    for index in range(lines):
        yield f"line {index}\n"
        await asyncio.sleep(interval)


def starlette() -> Any:
    """The Starlette example's routes, bare."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route, WebSocketRoute
    from starlette.websockets import WebSocket, WebSocketDisconnect

    visits = _Visits()

    async def hello(request: Request) -> Response:
        visits.count += 1
        return JSONResponse({"hello": "world", "visits": visits.count})

    async def slow(request: Request) -> Response:
        seconds = float(request.query_params.get("seconds", "2"))
        await asyncio.sleep(seconds)
        return JSONResponse({"slept": seconds})

    async def stream(request: Request) -> Response:
        return StreamingResponse(_lines(10, 0.5), media_type="text/plain")

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        with contextlib.suppress(WebSocketDisconnect):
            while True:
                await websocket.send_text(await websocket.receive_text())

    return Starlette(
        routes=[
            Route("/hello", hello),
            Route("/slow", slow),
            Route("/stream", stream),
            WebSocketRoute("/echo", echo),
        ]
    )


def fastapi() -> Any:
    """The FastAPI example's routes, bare."""
    from fastapi import FastAPI, Query, WebSocket, WebSocketDisconnect
    from starlette.responses import StreamingResponse

    visits = _Visits()
    app = FastAPI(title="forgezero-lifecycle FastAPI example (bare)")

    @app.get("/hello")
    async def hello() -> dict[str, object]:
        visits.count += 1
        return {"hello": "world", "visits": visits.count}

    @app.get("/slow")
    async def slow(seconds: Annotated[float, Query(ge=0, le=60)] = 2.0) -> dict[str, float]:
        await asyncio.sleep(seconds)
        return {"slept": seconds}

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        return StreamingResponse(_lines(10, 0.5), media_type="text/event-stream")

    @app.websocket("/echo")
    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        with contextlib.suppress(WebSocketDisconnect):
            while True:
                await websocket.send_text(await websocket.receive_text())

    return app
