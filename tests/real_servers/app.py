"""The app the real-server tests run: slow, streaming and WebSocket endpoints behind a Runtime.

Configured from the environment the fixture sets (the library itself reads none)::

    FORGEZERO_CONTROL_TOKEN   control token (required)
    FORGEZERO_REVISION        the revision this generation runs (40 lowercase hex)
    FORGEZERO_STREAM_GRACE    seconds before open streams and WebSockets get the drain notice

``/_test/counters`` is exempt from the gate (never counted, never refused): the tests poll it to
know a request is admitted before they begin a drain, without sleeping.

``Teapot`` is a user middleware added *after* ``runtime.install(app)``: a request carrying an
``x-teapot: <seconds>`` header is answered 418 by it after that many seconds, whatever its path,
control plane included, unless the runtime stays outermost.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from forgezero_lifecycle.asgi._types import ASGIApp, Receive, Scope, Send
from forgezero_lifecycle.runtime import Runtime

TEST_PREFIX = "/_test/"


def _exempt(scope: Scope) -> bool:
    path: str = scope["path"]
    return path.startswith(TEST_PREFIX)


runtime = Runtime(
    control_token=os.environ["FORGEZERO_CONTROL_TOKEN"],
    revision=os.environ.get("FORGEZERO_REVISION"),
    stream_grace=float(os.environ.get("FORGEZERO_STREAM_GRACE", "0.5")),
    exempt=_exempt,
)


async def fast(request: Request) -> Response:
    return JSONResponse({"ok": True})


async def slow(request: Request) -> Response:
    seconds = float(request.query_params.get("seconds", "1"))
    await asyncio.sleep(seconds)
    return JSONResponse({"slept": seconds})


async def stream(request: Request) -> Response:
    """``chunks`` chunks, ``interval`` seconds apart; never looks at the drain itself.

    With ``length=1`` the response declares its Content-Length instead of being chunked.
    """
    chunks = int(request.query_params.get("chunks", "3"))
    interval = float(request.query_params.get("interval", "0.1"))

    async def body() -> AsyncIterator[bytes]:
        for index in range(chunks):
            if index:
                await asyncio.sleep(interval)
            yield f"chunk {index}\n".encode()

    headers = {}
    if request.query_params.get("length"):  # declare the whole length up front: no chunking
        headers["content-length"] = str(sum(len(f"chunk {i}\n") for i in range(chunks)))
    return StreamingResponse(body(), media_type="text/plain", headers=headers)


async def flood(request: Request) -> Response:
    """An endless stream of 64 KiB chunks: a client that does not read fills every buffer."""
    chunk = b"x" * 65536

    async def body() -> AsyncIterator[bytes]:
        while True:
            yield chunk

    return StreamingResponse(body(), media_type="application/octet-stream")


async def push(websocket: WebSocket) -> None:
    """Sends a tick every ``interval`` seconds and never calls receive()."""
    interval = float(websocket.query_params.get("interval", "0.02"))
    await websocket.accept()
    try:
        while True:
            await websocket.send_text("tick")
            await asyncio.sleep(interval)
    except WebSocketDisconnect:
        pass


async def deny(websocket: WebSocket) -> None:
    """Refuses the handshake with a 403 denial sent as two body parts."""
    await websocket.send({"type": "websocket.http.response.start", "status": 403, "headers": []})
    await websocket.send(
        {"type": "websocket.http.response.body", "body": b"denied, ", "more_body": True}
    )
    await websocket.send({"type": "websocket.http.response.body", "body": b"in two parts"})


async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        while True:
            await websocket.send_text(await websocket.receive_text())
    except WebSocketDisconnect:
        pass


async def counters(request: Request) -> Response:
    return JSONResponse(runtime.in_flight().model_dump())


app = Starlette(
    routes=[
        Route("/fast", fast),
        Route("/slow", slow),
        Route("/stream", stream),
        Route("/flood", flood),
        WebSocketRoute("/ws", echo),
        WebSocketRoute("/ws/push", push),
        WebSocketRoute("/ws/deny", deny),
        Route(TEST_PREFIX + "counters", counters),
    ]
)
runtime.install(app)


class Teapot:
    """Answers 418 to any HTTP request with an ``x-teapot: <seconds>`` header, after a wait."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == b"x-teapot":
                    await asyncio.sleep(float(value))
                    await Response(status_code=418)(scope, receive, send)
                    return
        await self.app(scope, receive, send)


app.add_middleware(Teapot)  # after install, on purpose
