"""Prometheus metrics: the collector's families in process, and a served app scraped mid-drain."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from forgezero_lifecycle.client import SyncControlClient, drain_request
from forgezero_lifecycle.core._httpx import tls_context
from forgezero_lifecycle.core.scheduler import Scheduler
from forgezero_lifecycle.jobs import JobWorker, Lease, MemoryJobStore
from forgezero_lifecycle.metrics import RuntimeCollector
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.testing import ManualClock, settle
from forgezero_lifecycle.wire import paths
from tests.cli.conftest import CONTROL_TOKEN, REVISION_A, REVISION_B, StartServe

TOKEN = "metrics-test-token-0123456789"
NONCE = "M" * 43


def _drain(timeout_ms: int = 10_000) -> dict[str, Any]:
    return {
        "protocol": "forgezero-drain/v1",
        "nonce": NONCE,
        "sourceRevision": "a" * 40,
        "targetRevision": "b" * 40,
        "timeoutMs": timeout_ms,
    }


@pytest.mark.anyio
async def test_collector_reads_at_scrape() -> None:
    """In-flight, drain, job and schedule counters appear under their names and move."""
    clock = ManualClock()
    runtime = Runtime(control_token=TOKEN, clock=clock)
    store = MemoryJobStore(now=clock.monotonic)
    worker = JobWorker(store, clock=clock, owner="w1", lease=30.0, heartbeat_every=10.0)
    done = asyncio.Event()

    @worker.handler("q")
    async def handle(lease: Lease[Any]) -> None:
        done.set()

    scheduler = Scheduler(clock=clock)

    async def nightly() -> None:
        raise RuntimeError("boom")

    scheduler.add("nightly", nightly, every=60.0)
    runtime.add(worker)
    runtime.add(scheduler.participant())
    registry = CollectorRegistry()
    registry.register(RuntimeCollector(runtime))
    value = registry.get_sample_value

    assert value("forgezero_drain_state", {"state": "serving"}) == 1.0
    assert value("forgezero_in_flight", {"kind": "http"}) == 0.0
    await store.enqueue("q", {})
    worker.start()
    await asyncio.wait_for(done.wait(), 5)
    await scheduler.run_now("nightly")
    await settle()
    assert value("forgezero_jobs_claimed_total") == 1.0
    assert value("forgezero_jobs_completed_total") == 1.0
    assert value("forgezero_schedule_runs_total", {"job": "nightly"}) == 1.0
    assert value("forgezero_schedule_consecutive_failures", {"job": "nightly"}) == 1.0

    assert runtime.gate.admit_http()
    runtime.drain.begin(_drain(1000))
    assert value("forgezero_drain_state", {"state": "draining"}) == 1.0
    assert value("forgezero_in_flight", {"kind": "http"}) == 1.0
    assert value("forgezero_drains_begun_total") == 1.0
    await clock.advance(1.0)
    assert value("forgezero_drain_state", {"state": "failed"}) == 1.0
    assert value("forgezero_drains_ended_total", {"outcome": "failed"}) == 1.0
    assert value("forgezero_abandoned_total", {"kind": "http"}) == 1.0  # in flight at the cutoff
    assert value("forgezero_drain_duration_seconds_count") == 1.0
    assert value("forgezero_drain_duration_seconds_bucket", {"le": "1.0"}) == 1.0
    assert value("forgezero_drain_duration_seconds_bucket", {"le": "0.5"}) == 0.0
    runtime.gate.release_http()
    runtime.drain.rollback(NONCE)
    assert value("forgezero_drain_state", {"state": "serving"}) == 1.0
    assert value("forgezero_drains_ended_total", {"outcome": "rolled-back"}) == 0.0
    await worker.stop(timeout=0)


def test_served_only_with_registry() -> None:
    """Runtime(metrics=registry) registers the collector there; a second runtime's names clash."""
    registry = CollectorRegistry()
    Runtime(control_token=TOKEN, metrics=registry)
    assert registry.get_sample_value("forgezero_drains_begun_total") == 0.0
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Runtime(control_token=TOKEN, metrics=registry)


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(
        url + paths.RUNTIME_METRICS_PATH, timeout=10, trust_env=False, verify=tls_context()
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _get(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.mark.server
def test_gauges_during_drain(
    start_serve: StartServe,
) -> None:
    """In flight 1 while draining, a refusal counted, the WebSocket closed at the grace, then 0."""
    served = start_serve("tests.ops.app:app", env={"FORGEZERO_STREAM_GRACE": "0.5"})
    before = _scrape(served.url)
    assert _get(before, "forgezero_drain_state", state="serving") == 1.0
    assert _get(before, "forgezero_in_flight", kind="http") == 0.0
    socket_url = served.url.replace("http://", "ws://") + "/ws"
    with connect(socket_url, open_timeout=10) as websocket:
        served.wait_for(lambda: served.get("/_test/state").json()["websocket"] == 1, "open")
        slow = served.in_background("/slow?seconds=3")
        served.wait_for(lambda: served.get("/_test/state").json()["http"] == 1, "admitted")
        request = drain_request(
            source_revision=REVISION_A, target_revision=REVISION_B, timeout_ms=20_000
        )
        with SyncControlClient(served.url, token=CONTROL_TOKEN) as control:
            control.begin_drain(request)
            during = _scrape(served.url)
            refused = served.get("/slow?seconds=0")
            after_refusal = _scrape(served.url)
            final = control.wait_drained(request.nonce, timeout=30)
            assert final.status == "drained"
            drained = _scrape(served.url)
            control.rollback(request.nonce)
            serving = _scrape(served.url)
        with pytest.raises(ConnectionClosed):
            websocket.recv(timeout=10)
        assert websocket.close_code == 1012
    served.join()
    assert slow[0].status_code == 200
    assert refused.status_code == 503

    assert _get(during, "forgezero_drain_state", state="draining") == 1.0
    assert _get(during, "forgezero_drain_state", state="serving") == 0.0
    assert _get(during, "forgezero_in_flight", kind="http") == 1.0
    assert _get(during, "forgezero_drains_begun_total") == 1.0
    assert _get(after_refusal, "forgezero_refused_total", kind="http") == 1.0

    for kind in ("http", "websocket", "jobs", "schedules"):
        assert _get(drained, "forgezero_in_flight", kind=kind) == 0.0
    assert _get(drained, "forgezero_drain_state", state="drained") == 1.0
    assert _get(drained, "forgezero_drains_ended_total", outcome="drained") == 1.0
    assert _get(drained, "forgezero_drain_duration_seconds_count") == 1.0
    assert _get(drained, "forgezero_websockets_closed_at_grace_total") == 1.0
    assert _get(serving, "forgezero_drain_state", state="serving") == 1.0
