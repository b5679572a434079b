"""Background work the drain accounts for: ``Runtime.create_task`` and ``Runtime.hold``.

Admitted while intake is open (the not-ready grace included), refused with DrainingError once
it closed, counted under ``inFlight.jobs`` (the wire keeps the four counters of the JavaScript
generation), waited for by the drain, and cancelled by name at the cutoff. Starlette's
``BackgroundTasks`` run inside the request and are counted as it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from forgezero_lifecycle import DrainingError
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.testing import ASGIRecorder, ManualClock, settle
from tests.test_runtime import NONCE, TOKEN, drain_request

pytestmark = pytest.mark.anyio


def runtime_on(clock: ManualClock, **options: Any) -> Runtime:
    return Runtime(control_token=TOKEN, clock=clock, drain_on_signal=False, **options)


async def test_task_waited_for_and_counted_as_jobs() -> None:
    """A task started before the drain is counted under jobs and the drain waits for it."""
    clock = ManualClock()
    runtime = runtime_on(clock)
    release = asyncio.Event()
    task = runtime.create_task(release.wait(), name="send-receipt")
    assert runtime.in_flight().jobs == 1
    runtime.drain.begin(drain_request(timeout_ms=5000))
    await settle()
    status = runtime.drain.status(NONCE)
    assert status.status == "draining"
    assert status.model_dump(by_alias=True)["inFlight"] == {
        "http": 0,
        "websocket": 0,
        "jobs": 1,
        "schedules": 0,
    }
    release.set()
    assert await runtime.drain.wait() == "drained"
    assert task.done()
    assert runtime.background().completed == 1


async def test_refused_once_intake_closed() -> None:
    """Once intake closed, create_task raises DrainingError and never runs the coroutine (it is
    closed: no 'never awaited' warning), and hold raises too."""
    clock = ManualClock()
    runtime = runtime_on(clock)
    runtime.drain.begin(drain_request())
    ran: list[str] = []

    async def work() -> None:
        ran.append("ran")

    with pytest.raises(DrainingError) as raised:
        runtime.create_task(work(), name="late")
    assert raised.value.code == "RUNTIME_DRAINING"
    with pytest.raises(DrainingError):
        async with runtime.hold("late-hold"):
            ran.append("held")
    await settle()
    assert ran == []
    assert runtime.background().refused == 2
    assert await runtime.drain.wait() == "drained"


async def test_admitted_in_not_ready_grace() -> None:
    """Readiness is off but intake still open (the not-ready grace): work is still admitted."""
    clock = ManualClock()
    runtime = runtime_on(clock, not_ready_grace=1.0)
    runtime.drain.begin(drain_request(timeout_ms=5000))
    task = runtime.create_task(asyncio.sleep(0), name="in-grace")
    await task
    await clock.advance(1.0)
    with pytest.raises(DrainingError):
        runtime.create_task(asyncio.sleep(0), name="after-grace")
    assert await runtime.drain.wait() == "drained"


async def test_hold_counted_until_left() -> None:
    """A hold counts as background work until its block is left; the drain waits for it."""
    clock = ManualClock()
    runtime = runtime_on(clock)
    release = asyncio.Event()
    entered = asyncio.Event()

    async def section() -> None:
        async with runtime.hold("flush-cache"):
            entered.set()
            await release.wait()

    holder = asyncio.ensure_future(section())
    await entered.wait()
    assert runtime.background().running == ("flush-cache",)
    runtime.drain.begin(drain_request(timeout_ms=5000))
    await settle()
    assert runtime.drain.status(NONCE).in_flight.jobs == 1
    release.set()
    await holder
    assert await runtime.drain.wait() == "drained"


async def test_cancelled_by_name_at_cutoff(caplog: pytest.LogCaptureFixture) -> None:
    """What is still running at the drain's release margin (the cutoff) is cancelled, each
    logged by name, tasks and holds alike, so the drain ends within its deadline."""
    clock = ManualClock()
    runtime = runtime_on(clock)
    never = asyncio.Event()
    task = runtime.create_task(never.wait(), name="endless-export")

    async def section() -> None:
        async with runtime.hold("endless-section"):
            await never.wait()

    holder = asyncio.ensure_future(section())
    await settle()
    runtime.drain.begin(drain_request(timeout_ms=1000))
    with caplog.at_level(logging.WARNING, logger="forgezero_lifecycle.background"):
        await clock.advance(0.85)
        assert not task.done()
        await clock.advance(0.1)  # past 1 s less the 0.1 s release margin
        assert await runtime.drain.wait() == "drained"
    assert task.cancelled()
    assert holder.cancelled()
    messages = sorted(
        record.getMessage().split(":")[0]
        for record in caplog.records
        if record.name == "forgezero_lifecycle.background"  # another test may log INFO here
    )
    assert messages == [
        "background.cancelled name=endless-export kind=task",
        "background.cancelled name=endless-section kind=hold",
    ]
    assert runtime.background().cancelled == 1


async def test_failure_logged_by_name(caplog: pytest.LogCaptureFixture) -> None:
    """A task that fails is logged with its name and counted; the runtime keeps no broken
    reference (asyncio never warns that its exception was not retrieved)."""
    clock = ManualClock()
    runtime = runtime_on(clock)

    async def broken() -> None:
        raise ValueError("no such customer")

    with caplog.at_level(logging.ERROR, logger="forgezero_lifecycle.background"):
        task = runtime.create_task(broken(), name="charge-card")
        await asyncio.wait((task,))
    assert [record.getMessage() for record in caplog.records] == [
        "background.failed name=charge-card"
    ]
    assert runtime.background().failed == 1
    assert runtime.in_flight().jobs == 0


async def test_rollback_admits_again() -> None:
    """A rollback reopens background intake with the rest."""
    clock = ManualClock()
    runtime = runtime_on(clock)
    runtime.drain.begin(drain_request())
    with pytest.raises(DrainingError):
        runtime.create_task(asyncio.sleep(0), name="refused")
    runtime.drain.rollback(NONCE)
    await runtime.create_task(asyncio.sleep(0), name="admitted")


async def test_starlette_background_tasks_counted_as_request() -> None:
    """Starlette's BackgroundTasks run inside the request, after its response is sent: the
    request stays counted (inFlight.http) and the drain waits for them."""
    clock = ManualClock()
    runtime = runtime_on(clock)
    release = asyncio.Event()
    ran: list[str] = []

    async def after() -> None:
        await release.wait()
        ran.append("background")

    async def endpoint(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok", background=BackgroundTask(after))

    app = Starlette(routes=[Route("/", endpoint)])
    runtime.install(app)
    recorder = ASGIRecorder({"type": "http.request", "body": b""})
    scope = {"type": "http", "method": "GET", "path": "/", "root_path": "", "headers": []}
    call = asyncio.ensure_future(app(scope, recorder.receive, recorder.send))
    await settle()
    assert recorder.sent[-1]["body"] == b"ok"  # the response is out...
    assert runtime.in_flight().http == 1  # ...and the request is still counted
    runtime.drain.begin(drain_request(timeout_ms=5000))
    await settle()
    assert runtime.drain.status(NONCE).status == "draining"
    release.set()
    await call
    assert ran == ["background"]
    assert await runtime.drain.wait() == "drained"
