"""The Runtime wires gate, participants and drain under one deadline (manual clock)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from forgezero_lifecycle._errors import ConfigurationError, QueueIntakePausedError
from forgezero_lifecycle.core.queue import KeyedQueue
from forgezero_lifecycle.core.scheduler import Scheduler
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.testing import ManualClock, settle

pytestmark = pytest.mark.anyio

TOKEN = "runtime-test-token-0123456789"
NONCE = "R" * 43


def drain_request(timeout_ms: int = 10_000, nonce: str = NONCE) -> dict[str, Any]:
    return {
        "protocol": "forgezero-drain/v1",
        "nonce": nonce,
        "sourceRevision": "a" * 40,
        "targetRevision": "b" * 40,
        "timeoutMs": timeout_ms,
    }


async def test_drain_waits_for_queue() -> None:
    """Queue work accepted before the drain runs to its end; new submissions are refused."""
    clock = ManualClock()
    runtime = Runtime(control_token=TOKEN, clock=clock)
    queue = KeyedQueue(width=2, clock=clock)
    runtime.add(queue.participant())
    release = asyncio.Event()
    done: list[int] = []

    async def work(n: int) -> None:
        await release.wait()
        done.append(n)

    accepted = [asyncio.ensure_future(queue.run("user-1", work, n)) for n in range(3)]
    await settle()
    runtime.drain.begin(drain_request())
    with pytest.raises(QueueIntakePausedError):
        await queue.run("user-2", work, 99)
    status = runtime.drain.status(NONCE)
    assert (status.status, status.in_flight.jobs) == ("draining", 3)
    release.set()
    await asyncio.gather(*accepted)
    assert await runtime.drain.wait() == "drained"
    assert done == [0, 1, 2]
    assert runtime.drain.status(NONCE).in_flight.jobs == 0


async def test_drain_times_out_on_queue() -> None:
    """Work still running at the deadline: failed RUNTIME_DRAIN_TIMEOUT with jobs > 0."""
    clock = ManualClock()
    runtime = Runtime(control_token=TOKEN, clock=clock)
    queue = KeyedQueue(clock=clock)
    runtime.add(queue.participant())
    stuck = asyncio.Event()
    running = asyncio.ensure_future(queue.run("k", stuck.wait))
    await settle()
    runtime.drain.begin(drain_request(timeout_ms=1000))
    await clock.advance(1)
    status = runtime.drain.status(NONCE)
    assert (status.status, status.failure, status.in_flight.jobs) == (
        "failed",
        "RUNTIME_DRAIN_TIMEOUT",
        1,
    )
    stuck.set()
    await running


async def test_rollback_reopens_all() -> None:
    """Rollback resumes every participant and the gate; readiness returns."""
    clock = ManualClock()
    runtime = Runtime(control_token=TOKEN, clock=clock)
    queue = KeyedQueue(clock=clock)
    scheduler = Scheduler(clock=clock)
    runtime.add(queue.participant())
    runtime.add(scheduler.participant())
    runtime.drain.begin(drain_request())
    assert queue.statistics().intake_paused
    assert scheduler.statistics().intake_paused
    assert runtime.draining.is_set()
    runtime.drain.rollback(NONCE)
    assert not queue.statistics().intake_paused
    assert not scheduler.statistics().intake_paused
    assert runtime.gate.is_open
    assert not runtime.draining.is_set()
    assert await queue.run("k", asyncio.sleep, 0) is None


async def test_not_ready_grace_admits() -> None:
    """During the not-ready grace readiness is off but intake stays open; then it closes."""
    clock = ManualClock()
    runtime = Runtime(control_token=TOKEN, clock=clock, not_ready_grace=2.0)
    runtime.drain.begin(drain_request())
    await settle()
    assert runtime.draining.is_set()
    assert runtime.draining is runtime.gate.draining_event  # one fact, held by the gate
    assert runtime.gate.is_open
    await clock.advance(2)
    assert not runtime.gate.is_open


async def test_not_ready_grace_capped() -> None:
    """A grace longer than the deadline allows still leaves time for the drain itself."""
    clock = ManualClock()
    runtime = Runtime(control_token=TOKEN, clock=clock, not_ready_grace=60.0)
    runtime.drain.begin(drain_request(timeout_ms=1000))
    await clock.advance(0.5)
    assert not runtime.gate.is_open


async def test_stream_notice_after_grace() -> None:
    """Open streams get the notice after stream_grace, capped at half the remaining time."""
    clock = ManualClock()
    runtime = Runtime(control_token=TOKEN, clock=clock, stream_grace=30.0)
    assert runtime.gate.try_admit("websocket")
    runtime.drain.begin(drain_request(timeout_ms=4000))
    await clock.advance(1.9)
    assert not runtime.gate.notice.is_set()
    await clock.advance(0.1)
    assert runtime.gate.notice.is_set()
    runtime.gate.release("websocket")
    assert await runtime.drain.wait() == "drained"


async def test_control_token_required() -> None:
    """Without a token the control plane refuses to exist, unless loopback-only dev mode."""
    with pytest.raises(ConfigurationError):
        Runtime()
    with pytest.raises(ConfigurationError):
        Runtime(control_token="short")
    Runtime(insecure_loopback_control=True)


async def test_loopback_dev_mode() -> None:
    """insecure_loopback_control serves 127.0.0.1 and ::1 without a token, nobody else."""
    runtime = Runtime(insecure_loopback_control=True)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the control plane answers first")

    wrapped = runtime.wrap(app)
    url = "/.forgezero/runtime/drain/v1/status"
    for client, expected in ((("127.0.0.1", 1), 404), (("10.0.0.8", 1), 401)):
        transport = httpx.ASGITransport(app=wrapped, client=client)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            response = await http.get(url, params={"nonce": NONCE})
        assert response.status_code == expected


async def test_schedule_status_served() -> None:
    """GET schedules/v1/status shows each job's last run and failures for an incident."""
    clock = ManualClock()
    runtime = Runtime(control_token=TOKEN, clock=clock)
    scheduler = Scheduler(clock=clock)

    async def flaky() -> None:
        raise RuntimeError("provider timed out")

    scheduler.add("rotate-credentials", flaky, every=60)
    runtime.add(scheduler.participant())
    await scheduler.run_now("rotate-credentials")
    transport = httpx.ASGITransport(app=runtime.wrap(runtime.control))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        response = await http.get(
            "/.forgezero/runtime/schedules/v1/status",
            headers={"authorization": f"Bearer {TOKEN}"},
        )
    assert response.status_code == 200
    (job,) = response.json()["schedules"]
    assert job["name"] == "rotate-credentials"
    assert job["consecutive_failures"] == 1
    assert "provider timed out" in job["last_error"]


async def test_serve_finds_runtime() -> None:
    """serve is handed the app only; it finds the runtime both ways the runtime attaches."""
    from starlette.applications import Starlette

    from forgezero_lifecycle.serve import find_runtime

    runtime = Runtime(control_token=TOKEN)

    async def bare(scope: Any, receive: Any, send: Any) -> None:
        return None

    assert find_runtime(runtime.wrap(bare)) is runtime
    app = Starlette()
    runtime.install(app)
    assert find_runtime(app) is runtime
    assert find_runtime(bare) is None


async def test_stuck_stream_abandoned() -> None:
    """A response blocked by a client that does not read is given up at the release margin, so
    the drain ends drained inside its deadline, and a later drain after rollback is not stuck."""
    from forgezero_lifecycle.testing import ASGIRecorder

    clock = ManualClock()
    runtime = Runtime(control_token=TOKEN, clock=clock, stream_grace=0.2)
    never = asyncio.Event()

    async def stalled_send(message: Any) -> None:
        if message.get("more_body") is False or runtime.gate.draining:
            await never.wait()  # the server's flow control: the client reads nothing

    async def stream(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
        await receive()  # http.disconnect at the notice
        await send({"type": "http.response.body", "body": b"y", "more_body": True})  # blocks

    app = runtime.wrap(stream)
    recorder = ASGIRecorder({"type": "http.request", "body": b""})
    scope = {"type": "http", "path": "/s", "root_path": "", "method": "GET", "headers": []}
    call = asyncio.ensure_future(app(scope, recorder.receive, stalled_send))
    await settle()
    assert runtime.in_flight().http == 1
    runtime.drain.begin(drain_request(timeout_ms=1000))
    await clock.advance(0.5)
    assert runtime.drain.status(NONCE).status == "draining"  # the notice came, the send blocks
    await clock.advance(0.45)  # past 1 s minus the 0.1 s release margin, before the deadline
    assert call.done()
    await call
    status = runtime.drain.status(NONCE)
    assert (status.status, status.in_flight.http) == ("drained", 0)

    runtime.drain.rollback(NONCE)
    assert not runtime.gate.cutoff.is_set()
    runtime.drain.begin(drain_request(timeout_ms=1000, nonce="S" * 43))
    assert await runtime.drain.wait() == "drained"
