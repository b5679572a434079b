"""What blocks a drain: a status names the oldest running requests by route template and age."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from email.utils import formatdate
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.websockets import WebSocket

from forgezero_lifecycle.asgi._in_flight import oldest, route_template
from forgezero_lifecycle.asgi._types import Message, Receive, Scope, Send
from forgezero_lifecycle.client import drain_request as client_drain_request
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.testing import settle
from tests._starlette_routes import needs_route_in_scope

pytestmark = pytest.mark.anyio

TOKEN = "in-flight-test-token-0123456789"
NONCE = "B" * 43
AUTH = {"authorization": f"Bearer {TOKEN}"}


def drain_request() -> dict[str, Any]:
    request = client_drain_request(
        source_revision="a" * 40, target_revision="b" * 40, timeout_ms=60_000, nonce=NONCE
    )
    return request.model_dump(mode="json")


class Blocking:
    """Handlers that wait for :meth:`set`, each counted on the way in (:meth:`entered`)."""

    def __init__(self) -> None:
        self._release = asyncio.Event()
        self._arrived = asyncio.Semaphore(0)

    async def entered(self, count: int = 1) -> None:
        """Return once ``count`` more handlers are running (bounded: fails, never hangs)."""
        async with asyncio.timeout(10):
            for _ in range(count):
                await self._arrived.acquire()

    def set(self) -> None:
        self._release.set()

    async def wait(self) -> None:
        self._arrived.release()
        await self._release.wait()


def blocking_app(release: Blocking) -> Starlette:
    """Routes whose handlers wait for ``release``: requests a drain must wait for."""

    async def item(request: Request) -> Response:
        await release.wait()
        return JSONResponse(dict(request.path_params))

    async def socket(websocket: WebSocket) -> None:
        await websocket.accept()
        await release.wait()
        await websocket.close()

    return Starlette(
        routes=[
            Route("/items/{item_id:int}", item),
            Mount("/api", routes=[Route("/users/{name}", item)]),
            WebSocketRoute("/live/{room}", socket),
        ]
    )


@contextlib.asynccontextmanager
async def installed() -> AsyncIterator[tuple[Runtime, httpx.AsyncClient, Blocking]]:
    """A runtime installed on :func:`blocking_app`, and an in-process client of it."""
    release = Blocking()
    app = blocking_app(release)
    runtime = Runtime(control_token=TOKEN)
    runtime.install(app)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        yield runtime, client, release


@needs_route_in_scope()
async def test_status_names_route_template_never_raw_path() -> None:
    """A drain's status names a blocking request by method and route template: the ids and the
    query of its raw path never appear."""
    async with installed() as (runtime, client, release):
        request = asyncio.ensure_future(client.get("/items/4242?secret=s3cr3t"))
        await release.entered()
        begun = await client.post(
            "/.forgezero/runtime/drain/v1/begin", json=drain_request(), headers=AUTH
        )
        assert begun.status_code == 202
        status = await client.get(
            f"/.forgezero/runtime/drain/v1/status?nonce={NONCE}", headers=AUTH
        )
        body = status.json()
        assert body["status"] == "draining"
        [item] = body["detail"]["oldestInFlight"]
        assert item["kind"] == "http"
        assert item["method"] == "GET"
        assert item["route"] == "/items/{item_id}"
        assert item["ageMs"] >= 0
        assert "4242" not in status.text
        assert "s3cr3t" not in status.text
        release.set()
        assert (await request).status_code == 200
        assert await runtime.drain.wait() == "drained"
        done = runtime.drain.status(NONCE)
        assert done.detail is None  # nothing left running: nothing named


async def test_status_without_token_names_nothing() -> None:
    """The names sit behind the control token like the rest of the status."""
    async with installed() as (runtime, client, release):
        request = asyncio.ensure_future(client.get("/items/7"))
        await release.entered()
        runtime.drain.begin(drain_request())
        refused = await client.get(f"/.forgezero/runtime/drain/v1/status?nonce={NONCE}")
        assert refused.status_code == 401
        assert "items" not in refused.text
        release.set()
        await request


@needs_route_in_scope()
async def test_mounted_route_named_by_its_template() -> None:
    """A route inside a Mount is named by its own template, its parameters unfilled."""
    async with installed() as (runtime, client, release):
        request = asyncio.ensure_future(client.get("/api/users/alice"))
        await release.entered()
        [item] = runtime.oldest_in_flight()
        assert (item["method"], item["route"]) == ("GET", "/users/{name}")
        release.set()
        await request


async def test_no_router_names_the_method_only() -> None:
    """A request no route matched (a bare ASGI app) is named by its method, route null."""
    release = Blocking()

    async def bare(scope: Scope, receive: Receive, send: Send) -> None:
        await release.wait()
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    runtime = Runtime(control_token=TOKEN)
    wrapped = runtime.wrap(bare)
    transport = httpx.ASGITransport(app=wrapped)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        request = asyncio.ensure_future(client.delete("/orders/991?token=x"))
        await release.entered()
        assert runtime.oldest_in_flight() == [
            {"kind": "http", "method": "DELETE", "route": None, "ageMs": pytest.approx(0, abs=5000)}
        ]
        release.set()
        await request


async def test_at_most_five_oldest_first() -> None:
    """Of seven running requests, the status names the five oldest, oldest first."""
    async with installed() as (runtime, client, release):
        requests = []
        for n in range(7):
            requests.append(asyncio.ensure_future(client.get(f"/items/{n}")))
            await release.entered()
            await asyncio.sleep(0.01)  # each admitted at a later instant than the one before
        runtime.drain.begin(drain_request())
        detail = runtime.drain.status(NONCE).detail
        assert detail is not None
        items = detail["oldestInFlight"]
        assert len(items) == 5
        ages = [item["ageMs"] for item in items]
        assert ages == sorted(ages, reverse=True)
        assert ages[-1] > 0
        release.set()
        await asyncio.gather(*requests)


@needs_route_in_scope()
async def test_websocket_session_named() -> None:
    """A WebSocket session a drain waits for is named by kind and route template."""
    release = Blocking()
    app = blocking_app(release)
    runtime = Runtime(control_token=TOKEN)
    runtime.install(app)
    await _lifespan(app)
    sent: list[Message] = []
    incoming: asyncio.Queue[Message] = asyncio.Queue()
    incoming.put_nowait({"type": "websocket.connect"})
    scope = {
        "type": "websocket",
        "asgi": {"version": "3.0"},
        "path": "/live/room-17",
        "raw_path": b"/live/room-17",
        "root_path": "",
        "query_string": b"",
        "headers": [],
        "scheme": "ws",
        "subprotocols": [],
    }

    async def send(message: Message) -> None:
        sent.append(message)

    session = asyncio.ensure_future(app(scope, incoming.get, send))
    await release.entered()
    [item] = runtime.oldest_in_flight()
    assert (item["kind"], item["method"], item["route"]) == ("websocket", None, "/live/{room}")
    release.set()
    await session


async def _lifespan(app: Starlette) -> None:
    """Build the app's middleware stack (its first call) without serving anything."""
    queue: asyncio.Queue[Message] = asyncio.Queue()
    queue.put_nowait({"type": "lifespan.startup"})
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "lifespan.startup.complete":
            queue.put_nowait({"type": "lifespan.shutdown"})

    await app({"type": "lifespan", "asgi": {"version": "3.0"}}, queue.get, send)
    await settle()


def test_server_requests_named_with_the_age_the_server_keeps() -> None:
    """A server's own request objects are named from their scope, with the age the server
    records on them: hypercorn's start_time, uvicorn's Date of the request; unknown last."""

    class Stream:  # hypercorn's HTTPStream, as far as this is concerned
        def __init__(self, scope: Scope, start_time: float) -> None:
            self.scope, self.start_time = scope, start_time

    class Cycle:  # uvicorn's RequestResponseCycle
        def __init__(self, scope: Scope, default_headers: list[tuple[bytes, bytes]]) -> None:
            self.scope, self.default_headers = scope, default_headers

    route = SimpleNamespace(path_format="/a/{x}")
    now = time.time()
    date = formatdate(now - 30, usegmt=True).encode()
    running = [
        Stream({"method": "PUT"}, now - 3),
        Cycle({"method": "GET", "route": route}, [(b"date", date), (b"server", b"uvicorn")]),
        Cycle({"method": "POST"}, [(b"server", b"uvicorn")]),  # date header turned off
    ]
    items = oldest(running, [], [], limit=3)
    assert [(i["method"], i["route"]) for i in items] == [
        ("GET", "/a/{x}"),
        ("PUT", None),
        ("POST", None),
    ]
    assert 29_000 <= (items[0]["ageMs"] or 0) <= 32_000
    assert 2_500 <= (items[1]["ageMs"] or 0) <= 4_000
    assert items[2]["ageMs"] is None
    assert [i["method"] for i in oldest(running, [], [], limit=1)] == ["GET"]


def test_route_template_refuses_what_is_no_template() -> None:
    """Only a template beginning with "/" is reported; a route object that raises is none."""

    class Raising:
        @property
        def path_format(self) -> str:
            raise RuntimeError("broken route")

    assert route_template({"route": Raising()}) is None
    assert route_template({"route": SimpleNamespace(path="relative")}) is None
    assert route_template({"route": SimpleNamespace(path="/x/{id}")}) == "/x/{id}"
    assert route_template({}) is None
    assert route_template(None) is None


@needs_route_in_scope()
async def test_hypercorn_request_named_with_its_age(hypercorn: Any) -> None:
    """Under a real hypercorn, an HTTP/1 request served unwrapped (hypercorn's own stream) is
    named with the age hypercorn records for it, its query left out."""
    release = Blocking()
    app = blocking_app(release)
    runtime = Runtime(control_token=TOKEN)
    runtime.install(app)
    served = await hypercorn(app)
    client = await served.connect()
    await client.request(target="/items/31?session=zz-secret")
    await release.entered()
    await asyncio.sleep(0.05)  # an age hypercorn's clock can show
    [item] = runtime.oldest_in_flight()
    assert (item["kind"], item["method"], item["route"]) == ("http", "GET", "/items/{item_id}")
    assert item["ageMs"] is not None
    assert item["ageMs"] >= 50
    release.set()
    assert (await client.head()).status_code == 200
    await client.rest()
