"""Structured events: each drain and handoff step is logged once, named, with its fields."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from forgezero_lifecycle.core.handoff import StateHandoffController
from forgezero_lifecycle.jobs import JobWorker, Lease, MemoryJobStore
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.testing import ManualClock, settle

from .core.test_handoff import SRC, TGT, Adapter, cart, http, request, source

pytestmark = pytest.mark.anyio

TOKEN = "events-test-token-0123456789"
NONCE = "E" * 43
SOURCE = "a" * 40
TARGET = "b" * 40


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def events(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name.startswith("forgezero_lifecycle") and hasattr(r, "event")
    ]


def fields(record: logging.LogRecord, *names: str) -> dict[str, Any]:
    return {name: getattr(record, name) for name in names}


async def test_drain_phases_logged(caplog: pytest.LogCaptureFixture) -> None:
    """begin, readiness off, intake closed, stream notice, job release, drained, rollback."""
    caplog.set_level(logging.DEBUG, logger="forgezero_lifecycle")
    clock = ManualClock()
    runtime = Runtime(control_token=TOKEN, clock=clock, not_ready_grace=1.0, stream_grace=1.0)
    store = MemoryJobStore(now=clock.monotonic)
    worker = JobWorker(store, clock=clock, owner="w1", lease=30.0, heartbeat_every=10.0)
    started = asyncio.Event()

    @worker.handler("q")
    async def forever(lease: Lease[Any]) -> None:
        started.set()
        await asyncio.Event().wait()  # never finishes: released at the deadline margin

    runtime.add(worker)
    await store.enqueue("q", {})
    worker.start()
    await asyncio.wait_for(started.wait(), 5)
    assert runtime.gate.try_admit("websocket")  # an open session the stream notice ends
    runtime.drain.begin(
        {
            "protocol": "forgezero-drain/v1",
            "nonce": NONCE,
            "sourceRevision": SOURCE,
            "targetRevision": TARGET,
            "timeoutMs": 10_000,
        }
    )
    await clock.advance(2.0)  # grace over (1 s), stream grace over (1 s more)
    runtime.gate.release("websocket")
    for _ in range(8):
        await clock.advance(1.0)
    assert await asyncio.wait_for(runtime.drain.wait(), 5) == "drained"
    runtime.drain.rollback(NONCE)
    await settle()
    records = events(caplog)
    await worker.stop(timeout=0)
    assert [r.event for r in records] == [
        "drain.begin",
        "drain.readiness_off",
        "drain.intake_closed",
        "drain.stream_notice",
        "drain.jobs_released",
        "drain.drained",
        "drain.rollback",
    ]
    begin, readiness, closed, notice, released, drained, rollback = records
    assert fields(begin, "nonce_prefix", "source_revision", "target_revision", "timeout_ms") == {
        "nonce_prefix": NONCE[:8],
        "source_revision": SOURCE,
        "target_revision": TARGET,
        "timeout_ms": 10_000,
    }
    assert readiness.not_ready_grace_s == 1.0
    assert closed.elapsed_s == 1.0
    assert fields(notice, "http", "websocket", "elapsed_s") == {
        "http": 0,
        "websocket": 1,
        "elapsed_s": 2.0,
    }
    assert fields(released, "owner", "cancelled", "released", "pending") == {
        "owner": "w1",
        "cancelled": 1,
        "released": 1,
        "pending": False,
    }
    assert drained.nonce_prefix == NONCE[:8]
    assert rollback.rolled_from == "drained"
    for record in records:
        assert record.getMessage().startswith(record.event + " ")
        assert NONCE not in record.getMessage()
        assert TOKEN not in record.getMessage()


async def test_failed_drain_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """drain.failed is a warning with the failure code and the counters still in flight."""
    caplog.set_level(logging.INFO, logger="forgezero_lifecycle")
    clock = ManualClock()
    runtime = Runtime(control_token=TOKEN, clock=clock)
    assert runtime.gate.admit_http()
    runtime.drain.begin(
        {
            "protocol": "forgezero-drain/v1",
            "nonce": NONCE,
            "sourceRevision": SOURCE,
            "targetRevision": TARGET,
            "timeoutMs": 1000,
        }
    )
    await clock.advance(1.0)
    failed = [r for r in events(caplog) if r.event == "drain.failed"]
    assert len(failed) == 1
    assert failed[0].levelno == logging.WARNING
    assert fields(failed[0], "failure", "http", "websocket", "elapsed_s") == {
        "failure": "RUNTIME_DRAIN_TIMEOUT",
        "http": 1,
        "websocket": 0,
        "elapsed_s": 1.0,
    }
    runtime.gate.release_http()


async def test_handoff_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The steps of a handoff are events too; neither the value nor the token is in any."""
    caplog.set_level(logging.INFO, logger="forgezero_lifecycle")
    old = StateHandoffController(Adapter(value=cart("-secret-marker")))
    document = await old.export_document(SRC, TGT)
    new_adapter = Adapter()
    new = StateHandoffController(new_adapter)
    async with source(lambda _: http(document, headers="Content-Type: application/json\r\n")) as (
        port,
        _,
    ):
        body = request(port)
        new.begin(body, 5000)
        status = await asyncio.wait_for(new.wait(body["nonce"]), 10)
    assert status.status == "acknowledged"
    records = events(caplog)
    assert [r.event for r in records] == [
        "handoff.exported",
        "handoff.begin",
        "handoff.fetched",
        "handoff.acknowledged",
    ]
    assert records[0].bytes == len(document)
    assert records[3].digest == status.digest
    for record in records:
        text = record.getMessage() + repr(record.__dict__)
        assert "-secret-marker" not in text
        assert body["source"]["authorization"] not in text
    await old.aclose()
    await new.aclose()
