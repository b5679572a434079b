"""An app with a runtime and no logging setup of its own, as most apps are: what a user of plain
``uvicorn app:app`` (or gunicorn, or hypercorn) sees of a signal's drain in the server's log."""

from __future__ import annotations

import os

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from forgezero_lifecycle.runtime import Runtime


async def hello(request: Request) -> Response:
    return PlainTextResponse("hello")


app = Starlette(routes=[Route("/", hello)])
Runtime(
    control_token=os.environ["FORGEZERO_CONTROL_TOKEN"],
    signal_drain_timeout=float(os.environ.get("FORGEZERO_SIGNAL_DRAIN_TIMEOUT", "5")),
).install(app)
