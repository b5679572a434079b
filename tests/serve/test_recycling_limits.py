"""A worker's recycling limits (:class:`~forgezero_lifecycle.serve.worker.LimitWatch`): it
reports passing one only once it accepts, again while it still accepts, and never after it
stopped accepting."""

from __future__ import annotations

import asyncio

import pytest

from forgezero_lifecycle.serve import worker
from forgezero_lifecycle.serve.options import ServeOptions
from forgezero_lifecycle.serve.worker import LimitWatch, RequestCounter, resident_mib

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _fast_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "LOOK", 0.01)
    monkeypatch.setattr(worker, "REPORT_AGAIN", 0.05)


async def _app(scope: object, receive: object, send: object) -> None:
    return None


async def test_counter_calls_once_at_the_limit() -> None:
    """The limit-th HTTP request or WebSocket session calls back, once; lifespan is not one."""
    calls: list[int] = []
    counter = RequestCounter(_app, limit=3, on_limit=calls.append)
    await counter({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    for kind in ("http", "websocket", "http", "http"):
        await counter({"type": kind}, None, None)  # type: ignore[arg-type]
    assert calls == [3]
    assert counter.count == 4


async def test_no_request_limit_leaves_the_app_alone() -> None:
    """Without ``--max-requests`` nothing wraps the app: no cost per request."""
    watch = LimitWatch(ServeOptions(workers=2, worker_timeout=1.0), lambda why: None)
    assert watch.wrap(_app) is _app
    assert not watch.active


async def test_jitter_stays_in_its_range() -> None:
    """Each worker's limit is --max-requests plus 0 to --max-requests-jitter."""
    options = ServeOptions(workers=2, max_requests=400, max_requests_jitter=100)
    limits = {LimitWatch(options, lambda why: None).max_requests for _ in range(200)}
    assert limits <= set(range(400, 501))
    assert len(limits) > 1


async def test_requests_reported_once_accepting_and_again_until_it_stops() -> None:
    """Past its request limit before it accepts: reported as it begins to accept, then again
    while it accepts, and no more once it stopped accepting."""
    reports: list[str] = []
    watch = LimitWatch(ServeOptions(workers=1, max_requests=2), reports.append)
    app = watch.wrap(_app)
    for _ in range(2):
        await app({"type": "http"}, None, None)  # type: ignore[arg-type]
    assert reports == []
    watch.start()
    assert reports == ["max-requests: 2 requests"]
    await asyncio.sleep(0.2)
    assert len(reports) >= 2
    watch.stop()
    count = len(reports)
    await asyncio.sleep(0.1)
    assert len(reports) == count


async def test_lifetime_and_memory_are_looked_at() -> None:
    """A lifetime counts from the accept; a resident set over the limit is reported."""
    reports: list[str] = []
    lifetime = LimitWatch(ServeOptions(workers=1, max_worker_lifetime=0.05), reports.append)
    lifetime.start()
    await asyncio.sleep(0.3)
    lifetime.stop()
    assert reports[0] == "max-worker-lifetime: 0.05 s"
    memory = resident_mib()
    assert memory is not None
    assert memory > 1
    reports.clear()
    heavy = LimitWatch(ServeOptions(workers=1, max_worker_memory=1), reports.append)
    heavy.start()
    await asyncio.sleep(0.3)
    heavy.stop()
    assert reports[0].startswith("max-worker-memory: ")
