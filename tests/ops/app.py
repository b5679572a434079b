"""The app the operations tests serve: a runtime with the OpenAPI document and metrics enabled.

``/ws`` is a WebSocket that stays open until the drain's stream notice closes it.

Settings come from the environment ``forgezero-lifecycle serve`` and the tests set (the library
reads none). ``/_test/state`` is exempt from the gate: it tells the tests whether any drain or
handoff was started, so a fuzzer's requests can be checked to have changed nothing.
"""

from __future__ import annotations

import asyncio
import os

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from forgezero_lifecycle.asgi._types import Scope
from forgezero_lifecycle.runtime import Runtime
from tests.cli.apps import CounterState


def _exempt(scope: Scope) -> bool:
    path: str = scope["path"]
    return path.startswith("/_test/")


state = CounterState()
registry = CollectorRegistry()
runtime = Runtime(
    control_token=os.environ["FORGEZERO_CONTROL_TOKEN"],
    handoff_token=os.environ.get("FORGEZERO_HANDOFF_TOKEN"),
    revision=os.environ.get("FORGEZERO_REVISION"),
    not_ready_grace=float(os.environ.get("FORGEZERO_NOT_READY_GRACE", "0")),
    stream_grace=float(os.environ.get("FORGEZERO_STREAM_GRACE", "5")),
    state_adapter=state,
    exempt=_exempt,
    openapi=True,
    metrics=registry,
)


async def slow(request: Request) -> Response:
    await asyncio.sleep(float(request.query_params.get("seconds", "1")))
    return JSONResponse({"ok": True})


async def test_state(request: Request) -> Response:
    handoff = runtime.handoff
    return JSONResponse(
        {
            "drain_active": runtime.drain.active,
            "draining": runtime.draining.is_set(),
            "handoff_started": handoff is not None and handoff._request is not None,
            "imported": state.imported,
            **runtime.in_flight().model_dump(),
        }
    )


async def ws(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        while True:
            await websocket.receive_text()
    except WebSocketDisconnect:
        pass


app = Starlette(
    routes=[Route("/slow", slow), Route("/_test/state", test_state), WebSocketRoute("/ws", ws)]
)
runtime.install(app)
