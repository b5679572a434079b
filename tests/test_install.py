"""runtime.install keeps the runtime outermost on Starlette and FastAPI, whatever the order.

A user middleware added after ``install`` (``add_middleware`` inserts at the outside,
``@app.middleware("http")`` too) must neither shadow the control plane nor run outside the
counted region.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from forgezero_lifecycle._errors import ConfigurationError
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.testing import settle

pytestmark = pytest.mark.anyio

TOKEN = "install-test-token-0123456789"
NONCE = "I" * 43
PROBES = ("/.forgezero/runtime/ready", "/.forgezero/runtime/live")


async def work(request: Request) -> Response:
    return JSONResponse({"ok": True})


def build(framework: str) -> Starlette:
    if framework == "fastapi":
        app = FastAPI()
        app.add_api_route("/work", work)
        return app
    return Starlette(routes=[Route("/work", work)])


class Teapot:
    """A pure-ASGI user middleware that answers 418 for every HTTP path, once let go."""

    def __init__(self, app: Any, release: asyncio.Event) -> None:
        self.app = app
        self.release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.release.wait()
        await Response(status_code=418)(scope, receive, send)


def add_teapot(app: Starlette, style: str, release: asyncio.Event) -> None:
    """Add a 418-for-everything middleware after install, the way ``style`` says."""

    async def teapot(request: Request, call_next: Callable[..., Awaitable[Response]]) -> Response:
        await release.wait()
        return Response(status_code=418)

    if style == "asgi":
        app.add_middleware(Teapot, release=release)
    elif style == "base-http":
        app.add_middleware(BaseHTTPMiddleware, dispatch=teapot)
    else:
        assert isinstance(app, FastAPI)
        app.middleware("http")(teapot)


CASES = [
    ("starlette", "asgi"),
    ("starlette", "base-http"),
    ("fastapi", "asgi"),
    ("fastapi", "decorator"),
]


def drain_request(timeout_ms: int = 10_000) -> dict[str, Any]:
    return {
        "protocol": "forgezero-drain/v1",
        "nonce": NONCE,
        "sourceRevision": "a" * 40,
        "targetRevision": "b" * 40,
        "timeoutMs": timeout_ms,
    }


def client(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


@pytest.mark.parametrize(("framework", "style"), CASES)
async def test_later_middleware_no_shadow(framework: str, style: str) -> None:
    """/ready and /live are answered by the runtime even when a later middleware claims all."""
    app = build(framework)
    Runtime(control_token=TOKEN).install(app)
    release = asyncio.Event()
    release.set()
    add_teapot(app, style, release)
    async with client(app) as http:
        for probe in PROBES:
            assert (await http.get(probe)).status_code == 200, probe
        assert (await http.get("/work")).status_code == 418


@pytest.mark.parametrize(("framework", "style"), CASES)
async def test_inner_request_counted(framework: str, style: str) -> None:
    """The counted region encloses middleware added after install: the drain waits for it."""
    app = build(framework)
    runtime = Runtime(control_token=TOKEN)
    runtime.install(app)
    release = asyncio.Event()
    add_teapot(app, style, release)
    async with client(app) as http:
        request = asyncio.ensure_future(http.get("/work"))
        for _ in range(50):  # bounded: a few loop passes suffice in-process
            if runtime.in_flight().http:
                break
            await settle()
        assert runtime.in_flight().http == 1
        runtime.drain.begin(drain_request())
        await settle()
        assert runtime.drain.status(NONCE).status == "draining"
        assert (await http.get("/work")).status_code == 503  # refused before the teapot
        release.set()
        assert (await request).status_code == 418
    assert await runtime.drain.wait() == "drained"
    assert runtime.in_flight().http == 0


async def test_install_twice_refused() -> None:
    """A second install (same or another runtime) is refused: one gate per app."""
    app = Starlette()
    runtime = Runtime(control_token=TOKEN)
    runtime.install(app)
    for again in (runtime, Runtime(control_token=TOKEN)):
        with pytest.raises(ConfigurationError, match="already installed"):
            again.install(app)
    assert app.state.forgezero_runtime is runtime


async def test_install_on_serving_refused() -> None:
    """Once the middleware stack is built, wrapping it later would miss requests: refused."""
    app = Starlette(routes=[Route("/work", work)])
    async with client(app) as http:
        assert (await http.get("/work")).status_code == 200
    with pytest.raises(ConfigurationError, match="before it starts"):
        Runtime(control_token=TOKEN).install(app)
