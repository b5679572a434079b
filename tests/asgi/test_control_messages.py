"""What the control plane says is true: readiness names the drain's state, errors name the cause."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from forgezero_lifecycle.core.queue import KeyedQueue
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.testing import ManualClock, settle

pytestmark = pytest.mark.anyio

TOKEN = "control-messages-token-0123456789"
HANDOFF = "control-messages-handoff-token-0123456789ab"
AUTH = {"authorization": f"Bearer {TOKEN}"}
NONCE = "N" * 43
PREFIX = "/.forgezero/runtime/"


def drain_request(nonce: str = NONCE, timeout_ms: int = 1000) -> dict[str, Any]:
    return {
        "protocol": "forgezero-drain/v1",
        "nonce": nonce,
        "sourceRevision": "a" * 40,
        "targetRevision": "b" * 40,
        "timeoutMs": timeout_ms,
    }


@pytest.fixture
async def plane() -> AsyncIterator[tuple[httpx.AsyncClient, Runtime, ManualClock]]:
    clock = ManualClock()
    runtime = Runtime(control_token=TOKEN, handoff_token=HANDOFF, clock=clock)
    transport = httpx.ASGITransport(app=runtime.wrap(runtime.control))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        yield http, runtime, clock


async def test_readiness_says_drained(
    plane: tuple[httpx.AsyncClient, Runtime, ManualClock],
) -> None:
    """503 status follows the drain: draining while it runs, drained once it is."""
    http, runtime, _ = plane
    await http.post(PREFIX + "drain/v1/begin", json=drain_request(), headers=AUTH)
    assert await runtime.drain.wait() == "drained"
    ready = await http.get(PREFIX + "ready")
    assert (ready.status_code, ready.json()) == (503, {"ready": False, "status": "drained"})


async def test_failed_drain_says_failed(
    plane: tuple[httpx.AsyncClient, Runtime, ManualClock],
) -> None:
    """After a timeout, /ready says failed and another begin names the failure, not a running drain."""
    http, runtime, clock = plane
    queue = KeyedQueue(clock=clock)
    runtime.add(queue.participant())
    task = asyncio.ensure_future(queue.run("k", ManualClock().sleep, 3600))
    await settle()
    await http.post(PREFIX + "drain/v1/begin", json=drain_request(), headers=AUTH)
    assert (await http.get(PREFIX + "ready")).json()["status"] == "draining"
    await clock.advance(1)
    assert await runtime.drain.wait() == "failed"
    assert (await http.get(PREFIX + "ready")).json() == {"ready": False, "status": "failed"}
    again = await http.post(PREFIX + "drain/v1/begin", json=drain_request("M" * 43), headers=AUTH)
    body = again.json()
    assert (again.status_code, body["error"]) == (409, "RUNTIME_DRAIN_ALREADY_STARTED")
    assert "running" not in body["detail"]
    assert "failed (RUNTIME_DRAIN_TIMEOUT)" in body["detail"]
    assert "roll" in body["detail"]
    task.cancel()


async def test_begin_after_drained_ended(
    plane: tuple[httpx.AsyncClient, Runtime, ManualClock],
) -> None:
    """A drained generation refuses a second drain saying it is drained."""
    http, runtime, _ = plane
    await http.post(PREFIX + "drain/v1/begin", json=drain_request(), headers=AUTH)
    await runtime.drain.wait()
    again = await http.post(PREFIX + "drain/v1/begin", json=drain_request("M" * 43), headers=AUTH)
    assert "ended drained" in again.json()["detail"]


async def test_status_needs_nonce(
    plane: tuple[httpx.AsyncClient, Runtime, ManualClock],
) -> None:
    """No nonce at all is not "no drain with this nonce": the message names the missing parameter."""
    http, _, _ = plane
    response = await http.get(PREFIX + "drain/v1/status", headers=AUTH)
    assert response.status_code == 404
    assert response.json() == {
        "error": "RUNTIME_DRAIN_NOT_FOUND",
        "detail": "the nonce query parameter is required",
    }
    malformed = await http.get(PREFIX + "drain/v1/status?nonce=abc", headers=AUTH)
    assert "43 base64url" in malformed.json()["detail"]


async def test_handoff_status_needs_nonce() -> None:
    """The same for state/v1/status."""
    from tests.security._asgi import CONTROL_TOKEN, make_runtime

    _, app = make_runtime()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        response = await http.get(
            PREFIX + "state/v1/status", headers={"authorization": f"Bearer {CONTROL_TOKEN}"}
        )
    assert response.status_code == 404
    assert response.json() == {
        "error": "RUNTIME_STATE_NOT_FOUND",
        "detail": "the nonce query parameter is required",
    }


async def test_rollback_needs_nonce(
    plane: tuple[httpx.AsyncClient, Runtime, ManualClock],
) -> None:
    """A rollback body without a nonce says what the body needs."""
    http, _, _ = plane
    response = await http.post(PREFIX + "drain/v1/rollback", json={}, headers=AUTH)
    assert response.status_code == 404
    assert "nonce" in response.json()["detail"]
    assert "no drain" not in response.json()["detail"]


_NAME_THE_DRAIN = 'the body must name the drain: {"nonce": "..."}'
_MALFORMED_NONCE = "the nonce must be 43 base64url characters"


@pytest.mark.parametrize(
    ("body", "status", "error", "detail"),
    [
        (b"[]", 404, "RUNTIME_DRAIN_NOT_FOUND", _NAME_THE_DRAIN),
        (b'"nonce"', 404, "RUNTIME_DRAIN_NOT_FOUND", _NAME_THE_DRAIN),
        (b'{"nonce": null}', 404, "RUNTIME_DRAIN_NOT_FOUND", _NAME_THE_DRAIN),
        (b'{"nonce": 5}', 404, "RUNTIME_DRAIN_NOT_FOUND", _MALFORMED_NONCE),
        (b'{"nonce": ["' + b"N" * 43 + b'"]}', 404, "RUNTIME_DRAIN_NOT_FOUND", _MALFORMED_NONCE),
        (b'{"nonce": "short"}', 404, "RUNTIME_DRAIN_NOT_FOUND", _MALFORMED_NONCE),
        (
            b'{"nonce": "' + b"M" * 43 + b'"}',
            404,
            "RUNTIME_DRAIN_NOT_FOUND",
            "no drain with this nonce",
        ),
        (b"{", 400, "RUNTIME_DRAIN_REQUEST_INVALID", "the body is not strict UTF-8 JSON"),
    ],
)
async def test_bad_rollback_bodies_404(
    plane: tuple[httpx.AsyncClient, Runtime, ManualClock],
    body: bytes,
    status: int,
    error: str,
    detail: str,
) -> None:
    """A rollback that names no drain, a malformed nonce or an unknown one: 404, each saying which."""
    http, _, _ = plane
    await http.post(PREFIX + "drain/v1/begin", json=drain_request(), headers=AUTH)
    headers = {**AUTH, "content-type": "application/json"}
    response = await http.post(PREFIX + "drain/v1/rollback", content=body, headers=headers)
    assert (response.status_code, response.json()) == (status, {"error": error, "detail": detail})


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ({}, "send Authorization: Bearer <control token>"),
        ({"authorization": f"Basic {TOKEN}"}, "send Authorization: Bearer <control token>"),
        (
            {"authorization": "Bearer not-the-token-at-all-0123"},
            "the bearer token does not match this runtime's control token",
        ),
        (
            {"authorization": f"Bearer {HANDOFF}"},
            "the bearer token does not match this runtime's control token",
        ),
    ],
)
async def test_wrong_token_says_mismatch(
    plane: tuple[httpx.AsyncClient, Runtime, ManualClock], headers: dict[str, str], detail: str
) -> None:
    """A token that was sent but is wrong is not told to send one."""
    http, _, _ = plane
    response = await http.get(PREFIX + "drain/v1/status", params={"nonce": NONCE}, headers=headers)
    assert (response.status_code, response.json()["detail"]) == (401, detail)
