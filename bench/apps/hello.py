"""The hello apps of ``bench.server``: one fast endpoint, bare and with the runtime installed.

Every variant is a factory (``uvicorn --factory bench.apps.hello:fastapi_runtime``), so a server
process builds only the app it serves and imports the library only when it installs it:

* ``raw`` / ``raw_runtime`` / ``raw_counting``: a pure ASGI app answering ``/hello``; wrapped
  with ``Runtime.wrap``, or with the smallest pure-ASGI counting middleware (the floor any
  in-flight counter pays, for comparison);
* ``starlette`` / ``starlette_runtime``: a Starlette ``Route`` returning a ``JSONResponse``;
* ``fastapi`` / ``fastapi_runtime``: a FastAPI ``@app.get`` returning a dict.

The runtime variants use ``Runtime.install`` (Starlette, FastAPI) or ``Runtime.wrap`` (raw), as
the README tells users to.
"""

from __future__ import annotations

from typing import Any

Scope = dict[str, Any]
CONTROL_TOKEN = "bench-control-token-0123456789"
_BODY = b'{"hello":"world"}'
_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"application/json"), (b"content-length", b"17")],
}
_RESPONSE = {"type": "http.response.body", "body": _BODY}


async def _hello(scope: Scope, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return  # lifespan: nothing to set up
    await send(_START)
    await send(_RESPONSE)


def _runtime() -> Any:
    from forgezero_lifecycle.runtime import Runtime

    return Runtime(control_token=CONTROL_TOKEN)


def raw() -> Any:
    return _hello


def raw_runtime() -> Any:
    return _runtime().wrap(_hello)


class _Counting:
    """The least any in-flight counter does: count in ``try/finally`` around the call."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


def raw_counting() -> Any:
    return _Counting(_hello)


def starlette() -> Any:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def hello(request: Any) -> JSONResponse:
        return JSONResponse({"hello": "world"})

    return Starlette(routes=[Route("/hello", hello)])


def starlette_runtime() -> Any:
    app = starlette()
    _runtime().install(app)
    return app


def fastapi() -> Any:
    from fastapi import FastAPI

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @app.get("/hello")
    async def hello() -> dict[str, str]:
        return {"hello": "world"}

    return app


def fastapi_runtime() -> Any:
    app = fastapi()
    _runtime().install(app)
    return app
