"""The examples under a real uvicorn: the README's story, checked over real sockets.

This module replaces the ``server`` fixture with the example apps, so the shared ``http``,
``control`` and ``server_log`` fixtures drive an example instead of the test app.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any, Final

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from forgezero_lifecycle.core._httpx import tls_context

from ._control import (
    AUTH,
    CONTROL_TOKEN,
    POLL_BOUND,
    POLL_INTERVAL,
    SOURCE_REVISION,
    TARGET_REVISION,
    WireControl,
    new_nonce,
)
from ._servers import RunningServer, start_server, stop_server

pytestmark = [pytest.mark.server, pytest.mark.anyio]

EXAMPLES: Final = ("fastapi_app", "starlette_app")
HANDOFF_TOKEN: Final = secrets.token_urlsafe(32)
STATE_BEGIN: Final = "/.forgezero/runtime/state/v1/begin"
STATE_STATUS: Final = "/.forgezero/runtime/state/v1/status"
EXPORT: Final = "/.forgezero/runtime/state/v1/export"


def _start_example(
    name: str, revision: str, tmp_path_factory: pytest.TempPathFactory
) -> RunningServer:
    return start_server(
        "uvicorn-h11",
        f"examples.{name}.app:app",
        log_path=tmp_path_factory.mktemp("examples") / f"{name}-{revision[:8]}.log",
        environment={
            "FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN,
            "FORGEZERO_HANDOFF_TOKEN": HANDOFF_TOKEN,
            "FORGEZERO_REVISION": revision,
            "FORGEZERO_STREAM_GRACE": "0.5",
            # One job database per example, shared by both generations of a test session.
            "FORGEZERO_JOBS_DB": str(tmp_path_factory.getbasetemp() / f"{name}-jobs.sqlite3"),
        },
    )


@pytest.fixture(scope="module", params=EXAMPLES)
def example(request: pytest.FixtureRequest) -> str:
    """The example package's name under examples/."""
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def server(example: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The example app, running its old generation (SOURCE_REVISION) under uvicorn."""
    running = _start_example(example, SOURCE_REVISION, tmp_path_factory)
    try:
        yield running
    finally:
        stop_server(running)


@pytest.fixture
def next_generation(
    example: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """A second process of the same example, at the target revision."""
    running = _start_example(example, TARGET_REVISION, tmp_path_factory)
    try:
        yield running
    finally:
        stop_server(running)


async def test_example_serves_and_drains(
    server: RunningServer, http: httpx.AsyncClient, control: WireControl
) -> None:
    """The example answers on every endpoint, then drains: a WebSocket gets 1012 after the grace."""
    assert (await http.get("/hello")).json()["hello"] == "world"
    assert (await http.get("/slow", params={"seconds": 0})).json() == {"slept": 0.0}
    async with connect(server.ws_url + "/echo", open_timeout=5) as websocket:
        await websocket.send("hi")
        assert await websocket.recv() == "hi"
        nonce = await control.begin()
        assert (await http.get("/hello")).status_code == 503
        with pytest.raises(ConnectionClosed) as closed:
            async with asyncio.timeout(10):
                await websocket.recv()

    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1012
    assert (await control.wait_for_status(nonce, "drained", "failed"))["status"] == "drained"


@pytest.mark.parametrize("example", ["fastapi_app"], indirect=True)
async def test_fastapi_job_runs_once(http: httpx.AsyncClient, control: WireControl) -> None:
    """The FastAPI example runs a durable job once, with its receipt: POST /orders enqueues once per
    order id; the worker completes it under its fence."""
    order = {"user": "ada", "order": f"order-{secrets.token_hex(4)}"}
    first = (await http.post("/orders", json=order)).json()["job"]
    again = (await http.post("/orders", json=order)).json()["job"]
    assert first == again
    job: dict[str, Any] = {}
    async with asyncio.timeout(POLL_BOUND):
        while job.get("state") != "done":
            await asyncio.sleep(POLL_INTERVAL)
            job = (await http.get(f"/jobs/{first}")).json()
    assert (job["attempts"], job["result"]) == (1, {"sent": True})
    ledger = [(await http.post("/ledger/ada", params={"entry": e})).json() for e in "abc"]
    assert ledger[-1][-3:] == ["a", "b", "c"]
    schedules = (await http.get("/.forgezero/runtime/schedules/v1/status", headers=AUTH)).json()[
        "schedules"
    ]
    assert [s["name"] for s in schedules] == ["report-pending-jobs"]


async def test_example_stream_ends(http: httpx.AsyncClient, control: WireControl) -> None:
    """The example's stream ends cooperatively when a drain begins: it watches runtime.draining and
    ends with a last message of its own."""
    params = {"events": 100, "lines": 100, "interval": 0.2}
    async with http.stream("GET", "/stream", params=params) as response:
        lines = response.aiter_lines()
        first = await anext(lines)
        nonce = await control.begin()
        rest = [line async for line in lines if line]

    assert first in ("data: tick 0", "line 0")
    assert "reconnect" in rest[-1]
    assert len(rest) < 100
    assert (await control.wait_for_status(nonce, "drained", "failed"))["status"] == "drained"


async def test_example_hands_over_visits(
    server: RunningServer,
    next_generation: RunningServer,
    http: httpx.AsyncClient,
    control: WireControl,
) -> None:
    """The new generation fetches the old one's typed state over loopback and carries it on."""
    visits = (await http.get("/hello")).json()["visits"]
    await control.begin()
    nonce = new_nonce()
    export = (
        f"{server.url}{EXPORT}?sourceRevision={SOURCE_REVISION}&targetRevision={TARGET_REVISION}"
    )

    async with httpx.AsyncClient(
        base_url=next_generation.url, timeout=10.0, verify=tls_context()
    ) as new:
        begun = await new.post(STATE_BEGIN, json=_handoff_request(nonce, export), headers=AUTH)
        assert begun.status_code == 202, begun.text
        status = await _wait_for_handoff(new, nonce)
        after = (await new.get("/hello")).json()["visits"]

    assert status["status"] == "acknowledged"
    assert status["cursor"] == f"visits-{visits}"
    assert "value" not in status
    assert after == visits + 1


def _handoff_request(nonce: str, url: str) -> dict[str, Any]:
    return {
        "protocol": "example.visits",
        "nonce": nonce,
        "schemaVersion": 1,
        "sourceRevision": SOURCE_REVISION,
        "targetRevision": TARGET_REVISION,
        "source": {"url": url, "authorization": f"Bearer {HANDOFF_TOKEN}"},
        "timeoutMs": 5000,
    }


async def _wait_for_handoff(client: httpx.AsyncClient, nonce: str) -> dict[str, Any]:
    for _ in range(int(POLL_BOUND / POLL_INTERVAL)):
        response = await client.get(STATE_STATUS, params={"nonce": nonce}, headers=AUTH)
        assert response.status_code == 200, response.text
        status: dict[str, Any] = response.json()
        if status["status"] != "pending":
            return status
        await asyncio.sleep(POLL_INTERVAL)
    raise AssertionError(f"the handoff {nonce} is still pending after {POLL_BOUND} s")
