"""The control plane in process (asgi-lifespan + httpx): routes, auth, limits, error codes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from forgezero_lifecycle.runtime import Runtime

pytestmark = pytest.mark.anyio

TOKEN = "control-token-0123456789abcdef"
HANDOFF_TOKEN = "handoff-token-0123456789abcdefghijklmnopqrs"
AUTH = {"authorization": f"Bearer {TOKEN}"}
NONCE = "N" * 43
BEGIN = "/.forgezero/runtime/drain/v1/begin"
STATUS = "/.forgezero/runtime/drain/v1/status"
ROLLBACK = "/.forgezero/runtime/drain/v1/rollback"
READY = "/.forgezero/runtime/ready"


def drain_request(nonce: str = NONCE, **changes: Any) -> dict[str, Any]:
    return {
        "protocol": "forgezero-drain/v1",
        "nonce": nonce,
        "sourceRevision": "a" * 40,
        "targetRevision": "b" * 40,
        "timeoutMs": 5000,
        **changes,
    }


@pytest.fixture
async def client() -> AsyncIterator[tuple[httpx.AsyncClient, Runtime]]:
    async def hello(request: Any) -> PlainTextResponse:
        return PlainTextResponse("hello")

    app = Starlette(routes=[Route("/", hello), Route("/{path:path}", hello)])
    runtime = Runtime(control_token=TOKEN, handoff_token=HANDOFF_TOKEN, revision="a" * 40)
    runtime.install(app)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            yield http, runtime


async def test_begin_status_and_duplicate(client: tuple[httpx.AsyncClient, Runtime]) -> None:
    """begin answers 202, an exact retry is a duplicate, status reports the drain."""
    http, runtime = client
    first = await http.post(BEGIN, json=drain_request(), headers=AUTH)
    again = await http.post(BEGIN, json=drain_request(), headers=AUTH)
    await runtime.drain.wait()
    assert (first.status_code, first.json()) == (202, {"accepted": True, "duplicate": False})
    assert (again.status_code, again.json()) == (202, {"accepted": True, "duplicate": True})
    status = await http.get(STATUS, params={"nonce": NONCE}, headers=AUTH)
    assert status.status_code == 200
    assert status.json()["status"] == "drained"
    assert status.headers["cache-control"] == "no-store"


async def test_a_second_nonce_conflicts(client: tuple[httpx.AsyncClient, Runtime]) -> None:
    """A different nonce during a drain is 409 RUNTIME_DRAIN_ALREADY_STARTED."""
    http, _ = client
    await http.post(BEGIN, json=drain_request(), headers=AUTH)
    response = await http.post(BEGIN, json=drain_request("M" * 43), headers=AUTH)
    assert (response.status_code, response.json()["error"]) == (
        409,
        "RUNTIME_DRAIN_ALREADY_STARTED",
    )


async def test_revision_mismatch_is_409(client: tuple[httpx.AsyncClient, Runtime]) -> None:
    """A drain aimed at another revision is refused and readiness stays 200."""
    http, _ = client
    response = await http.post(BEGIN, json=drain_request(sourceRevision="c" * 40), headers=AUTH)
    assert (response.status_code, response.json()["error"]) == (
        409,
        "RUNTIME_DRAIN_REVISION_MISMATCH",
    )
    assert (await http.get(READY)).status_code == 200


async def test_readiness_follows_drain(
    client: tuple[httpx.AsyncClient, Runtime],
) -> None:
    """Readiness is 503 from the instant a drain begins; rollback restores 200 and admission."""
    http, runtime = client
    assert (await http.get(READY)).json() == {"ready": True}
    await http.post(BEGIN, json=drain_request(), headers=AUTH)
    not_ready = await http.get(READY)
    assert (not_ready.status_code, not_ready.json()) == (
        503,
        {"ready": False, "status": "draining"},
    )
    assert (await http.get("/.forgezero/runtime/live")).status_code == 200
    assert (await http.get("/")).status_code == 503
    rolled = await http.post(ROLLBACK, json={"nonce": NONCE}, headers=AUTH)
    assert (rolled.status_code, rolled.json()["status"]) == (200, "rolled-back")
    assert (await http.get(READY)).status_code == 200
    assert (await http.get("/")).text == "hello"
    assert runtime.gate.is_open


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer wrong"},
        {"authorization": f"Bearer {TOKEN[:-1]}"},
        {"authorization": f"Basic {TOKEN}"},
        {"authorization": f"Bearer {HANDOFF_TOKEN}"},
    ],
    ids=["none", "wrong", "prefix", "scheme", "handoff-token"],
)
async def test_unauthenticated_begin_401(
    client: tuple[httpx.AsyncClient, Runtime], headers: dict[str, str]
) -> None:
    """Without the control token: 401 with WWW-Authenticate, no token echoed, no drain."""
    http, runtime = client
    response = await http.post(BEGIN, json=drain_request(), headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"] == "RUNTIME_UNAUTHORIZED"
    assert TOKEN not in response.text
    assert HANDOFF_TOKEN not in response.text
    assert not runtime.drain.active
    assert (await http.get(READY)).status_code == 200


@pytest.mark.parametrize(
    ("content", "content_type", "status", "code"),
    [
        (b"x" * (16 * 1024 + 1), "application/json", 413, "RUNTIME_BODY_TOO_LARGE"),
        (b"{}", "text/plain", 415, "RUNTIME_CONTENT_TYPE"),
        (b"{", "application/json", 400, "RUNTIME_DRAIN_REQUEST_INVALID"),
        (b'{"a":NaN}', "application/json", 400, "RUNTIME_DRAIN_REQUEST_INVALID"),
        (b"\xff\xfe", "application/json", 400, "RUNTIME_DRAIN_REQUEST_INVALID"),
        (b"[]", "application/json", 400, "RUNTIME_DRAIN_REQUEST_INVALID"),
    ],
    ids=["oversized", "content-type", "truncated", "nan", "invalid-utf8", "array"],
)
async def test_bad_bodies_4xx(
    client: tuple[httpx.AsyncClient, Runtime],
    content: bytes,
    content_type: str,
    status: int,
    code: str,
) -> None:
    """Malformed, oversized or mistyped bodies answer 4xx with a stable code; no drain starts."""
    http, runtime = client
    headers = {**AUTH, "content-type": content_type}
    response = await http.post(BEGIN, content=content, headers=headers)
    assert (response.status_code, response.json()["error"]) == (status, code)
    assert not runtime.drain.active
    accepted = await http.post(BEGIN, json=drain_request(), headers=AUTH)
    assert accepted.json() == {"accepted": True, "duplicate": False}


async def test_wrong_method_405(client: tuple[httpx.AsyncClient, Runtime]) -> None:
    """A known path with the wrong method answers 405 and names the allowed method."""
    http, _ = client
    response = await http.get(BEGIN, headers=AUTH)
    assert (response.status_code, response.headers["allow"]) == (405, "POST")
    response = await http.post(READY)
    assert (response.status_code, response.headers["allow"]) == (405, "GET, HEAD")


async def test_unknown_control_path_is_404(client: tuple[httpx.AsyncClient, Runtime]) -> None:
    """Paths under the control prefix never fall through to the user's app."""
    http, _ = client
    response = await http.get("/.forgezero/runtime/nope")
    assert (response.status_code, response.json()["error"]) == (404, "RUNTIME_NOT_FOUND")


async def test_unknown_nonce_404(client: tuple[httpx.AsyncClient, Runtime]) -> None:
    """Status for a nonce that never began is RUNTIME_DRAIN_NOT_FOUND."""
    http, _ = client
    response = await http.get(STATUS, params={"nonce": NONCE}, headers=AUTH)
    assert (response.status_code, response.json()["error"]) == (404, "RUNTIME_DRAIN_NOT_FOUND")


async def test_state_without_adapter_404(
    client: tuple[httpx.AsyncClient, Runtime],
) -> None:
    """A runtime with no state adapter says so with RUNTIME_STATE_NOT_FOUND, not a 5xx."""
    http, _ = client
    response = await http.get(
        "/.forgezero/runtime/state/v1/status", params={"nonce": NONCE}, headers=AUTH
    )
    assert (response.status_code, response.json()["error"]) == (404, "RUNTIME_STATE_NOT_FOUND")


async def test_drain_waits_in_flight() -> None:
    """A slow request admitted before begin finishes; the drain is drained only afterwards."""
    release = asyncio.Event()
    entered = asyncio.Event()

    async def slow(request: Any) -> PlainTextResponse:
        entered.set()
        await release.wait()
        return PlainTextResponse("done")

    app = Starlette(routes=[Route("/slow", slow)])
    runtime = Runtime(control_token=TOKEN)
    runtime.install(app)
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            pending = asyncio.ensure_future(http.get("/slow"))
            await entered.wait()
            await http.post(BEGIN, json=drain_request(), headers=AUTH)
            status = (await http.get(STATUS, params={"nonce": NONCE}, headers=AUTH)).json()
            assert (status["status"], status["inFlight"]["http"]) == ("draining", 1)
            release.set()
            response = await pending
            assert (response.text, response.headers["connection"]) == ("done", "close")
            assert await runtime.drain.wait() == "drained"


async def test_early_answer_reads_body() -> None:
    """A 401 sent before the body was read still consumes it, so the client sees the answer."""
    runtime = Runtime(control_token=TOKEN)
    events: list[str] = []
    chunks = [
        {"type": "http.request", "body": b'{"nonce"', "more_body": True},
        {"type": "http.request", "body": b":1}", "more_body": False},
    ]

    async def receive() -> dict[str, Any]:
        events.append("receive")
        return chunks.pop(0)

    async def send(message: dict[str, Any]) -> None:
        events.append(message["type"])

    scope = {
        "type": "http",
        "method": "POST",
        "path": BEGIN,
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }
    await runtime.control(scope, receive, send)
    assert events == ["receive", "receive", "http.response.start", "http.response.body"]


CURRENT = "/.forgezero/runtime/drain/v1/current"


async def test_current_drain_status(
    client: tuple[httpx.AsyncClient, Runtime],
) -> None:
    """GET drain/v1/current finds the running drain without its nonce; 404 with a detail if none."""
    http, _ = client
    none = await http.get(CURRENT, headers=AUTH)
    assert none.status_code == 404
    assert none.json()["error"] == "RUNTIME_DRAIN_NOT_FOUND"
    assert "no drain is running" in none.json()["detail"]
    await http.post(BEGIN, json=drain_request(), headers=AUTH)
    current = await http.get(CURRENT, headers=AUTH)
    by_nonce = await http.get(STATUS, params={"nonce": NONCE}, headers=AUTH)
    assert current.status_code == 200
    assert current.json()["nonce"] == NONCE
    assert current.json() == by_nonce.json()
    assert current.headers["cache-control"] == "no-store"
    await http.post(ROLLBACK, json={"nonce": NONCE}, headers=AUTH)
    assert (await http.get(CURRENT, headers=AUTH)).status_code == 404


async def test_current_drain_needs_token(
    client: tuple[httpx.AsyncClient, Runtime],
) -> None:
    """The nonce is what rollback needs: without the control token current reveals nothing."""
    http, _ = client
    await http.post(BEGIN, json=drain_request(), headers=AUTH)
    for headers in ({}, {"authorization": f"Bearer {HANDOFF_TOKEN}"}):
        response = await http.get(CURRENT, headers=headers)
        assert (response.status_code, response.json()["error"]) == (401, "RUNTIME_UNAUTHORIZED")
        assert NONCE not in response.text
