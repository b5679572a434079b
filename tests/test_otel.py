"""OpenTelemetry (the [otel] extra): each drain a span with its phases, the runtime's metrics,
each handover a span with its steps and its generation's drain as a child."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from forgezero_lifecycle.core.drain import DrainController
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.serve import machine as m
from forgezero_lifecycle.serve.supervisor import HandoverLog
from forgezero_lifecycle.testing import ManualClock

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "otel-test-control-token-0123456789"
NONCE = "Otel-drain_nonce-0123456789abcdefghijklmnop"
REVISION = "a" * 40
TARGET = "b" * 40
AUTH = {"authorization": f"Bearer {TOKEN}"}


def drain_body(timeout_ms: int = 10_000) -> dict[str, Any]:
    return {
        "protocol": "forgezero-drain/v1",
        "nonce": NONCE,
        "sourceRevision": REVISION,
        "targetRevision": TARGET,
        "timeoutMs": timeout_ms,
    }


class Telemetry:
    """An SDK tracer provider and meter provider that keep everything in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def spans(self, name: str = "forgezero.drain") -> list[ReadableSpan]:
        return [span for span in self.exporter.get_finished_spans() if span.name == name]

    def points(self, metric: str) -> dict[tuple[tuple[str, Any], ...], Any]:
        """The data points of ``metric`` by their attributes (value, or the histogram point)."""
        found: dict[tuple[tuple[str, Any], ...], Any] = {}
        data = self.reader.get_metrics_data()
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for each in scope.metrics:
                    if each.name == metric:
                        for point in each.data.data_points:
                            value = getattr(point, "value", point)
                            found[tuple(sorted(point.attributes.items()))] = value
        return found


def events(span: ReadableSpan) -> list[tuple[str, float]]:
    """The span's events, each with its seconds after the span's start."""
    assert span.start_time is not None
    return [(event.name, (event.timestamp - span.start_time) / 1e9) for event in span.events]


class Gate:
    """A route whose handler waits until released: a request a drain must wait for."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def slow(self, request: Request) -> Response:
        self.entered.set()
        await self.release.wait()
        return PlainTextResponse("done")


@contextlib.asynccontextmanager
async def served(
    telemetry: Telemetry, clock: ManualClock, **settings: Any
) -> AsyncIterator[tuple[Runtime, httpx.AsyncClient, Gate]]:
    gate = Gate()
    app = Starlette(routes=[Route("/reports/{report_id}", gate.slow)])
    runtime = Runtime(
        control_token=TOKEN,
        revision=REVISION,
        clock=clock,
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
        **settings,
    )
    runtime.install(app)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        yield runtime, client, gate


def no_secret(span: ReadableSpan) -> None:
    """Neither the token nor the whole nonce appears in the span."""
    values = [*dict(span.attributes or {}).values()]
    for event in span.events:
        values.extend(dict(event.attributes or {}).values())
    text = " ".join(map(str, values))
    assert NONCE not in text
    assert TOKEN not in text


async def test_control_plane_drain_is_a_span_with_phase_events() -> None:
    """A drain begun through the control plane is one forgezero.drain span: an event per phase
    at its time on the runtime's clock, the revisions, the nonce's prefix, the deadline and the
    final counts as attributes."""
    telemetry, clock = Telemetry(), ManualClock()
    async with served(telemetry, clock, not_ready_grace=2.0, stream_grace=3.0) as (
        runtime,
        client,
        gate,
    ):
        request = asyncio.ensure_future(client.get("/reports/77"))
        await gate.entered.wait()
        begun = await client.post(
            "/.forgezero/runtime/drain/v1/begin", json=drain_body(), headers=AUTH
        )
        assert begun.status_code == 202
        await clock.advance(2)  # the not-ready grace
        await clock.advance(3)  # the stream grace: the request still runs
        assert telemetry.spans() == []  # a span is exported once the drain ended
        gate.release.set()
        assert (await request).status_code == 200
        assert await runtime.drain.wait() == "drained"
    [span] = telemetry.spans()
    assert events(span) == [
        ("readiness off", 0.0),
        ("intake closed", 2.0),
        ("stream notice", 5.0),
        ("drained", 5.0),
    ]
    assert dict(span.events[2].attributes or {}) == {
        "forgezero.in_flight.http": 1,
        "forgezero.in_flight.websocket": 0,
    }
    assert dict(span.attributes or {}) == {
        "forgezero.revision": REVISION,
        "forgezero.drain.nonce_prefix": NONCE[:8],
        "forgezero.drain.source_revision": REVISION,
        "forgezero.drain.target_revision": TARGET,
        "forgezero.drain.timeout_ms": 10_000,
        "forgezero.drain.origin": "control",
        "forgezero.drain.outcome": "drained",
        "forgezero.drain.in_flight.http": 0,
        "forgezero.drain.in_flight.websocket": 0,
        "forgezero.drain.in_flight.jobs": 0,
        "forgezero.drain.in_flight.schedules": 0,
    }
    assert span.parent is None
    assert span.status.status_code is StatusCode.UNSET
    no_secret(span)


async def test_failed_drain_span_is_an_error_with_what_was_left() -> None:
    """A drain that misses its deadline ends its span failed: status ERROR, the failure code, the
    cutoff and what was still in flight."""
    telemetry, clock = Telemetry(), ManualClock()
    async with served(telemetry, clock, stream_grace=1.0) as (runtime, client, gate):
        request = asyncio.ensure_future(client.get("/reports/1"))
        await gate.entered.wait()
        runtime.drain.begin(drain_body(timeout_ms=4_000))
        await clock.advance(5)
        assert await runtime.drain.wait() == "failed"
        gate.release.set()
        await request
    [span] = telemetry.spans()
    assert [name for name, _ in events(span)] == [
        "readiness off",
        "intake closed",
        "stream notice",
        "cutoff",
        "failed",
    ]
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "RUNTIME_DRAIN_TIMEOUT"
    attributes = dict(span.attributes or {})
    assert attributes["forgezero.drain.failure"] == "RUNTIME_DRAIN_TIMEOUT"
    assert attributes["forgezero.drain.in_flight.http"] == 1


async def test_rollback_ends_the_span() -> None:
    """A drain rolled back while draining ends its span with a "rolled back" event."""
    telemetry, clock = Telemetry(), ManualClock()
    async with served(telemetry, clock) as (runtime, client, gate):
        request = asyncio.ensure_future(client.get("/reports/2"))
        await gate.entered.wait()
        runtime.drain.begin(drain_body())
        await clock.advance(1)
        back = await client.post(
            "/.forgezero/runtime/drain/v1/rollback", json={"nonce": NONCE}, headers=AUTH
        )
        assert back.json()["status"] == "rolled-back"
        gate.release.set()
        await request
    [span] = telemetry.spans()
    assert events(span) == [("readiness off", 0.0), ("intake closed", 0.0), ("rolled back", 1.0)]
    assert dict(span.attributes or {})["forgezero.drain.outcome"] == "rolled-back"


async def test_metrics_in_flight_refused_abandoned_duration() -> None:
    """In flight by kind, refused while draining, abandoned at the cutoff and the drain's
    duration, each per revision, read from the runtime when the reader collects."""
    telemetry, clock = Telemetry(), ManualClock()
    revision = ("forgezero.revision", REVISION)

    def kind(name: str) -> tuple[tuple[str, Any], ...]:
        return (revision, ("kind", name))

    async with served(telemetry, clock, stream_grace=1.0) as (runtime, client, gate):
        request = asyncio.ensure_future(client.get("/reports/3"))
        await gate.entered.wait()
        assert telemetry.points("forgezero.in_flight")[kind("http")] == 1
        runtime.drain.begin(drain_body(timeout_ms=4_000))
        refused = await client.get("/reports/4")
        assert refused.status_code == 503
        await clock.advance(5)
        assert await runtime.drain.wait() == "failed"
        gate.release.set()
        await request
    assert telemetry.points("forgezero.refused")[kind("http")] == 1
    assert telemetry.points("forgezero.abandoned")[kind("http")] == 1
    assert telemetry.points("forgezero.in_flight")[kind("http")] == 0
    durations = telemetry.points("forgezero.drain.duration")
    point = durations[(("forgezero.drain.outcome", "failed"), revision)]
    assert (point.count, point.sum) == (1, 4.0)


async def test_an_observer_that_raises_never_stops_a_drain(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An observer's error is logged and the drain goes on."""

    class Broken:
        def drain_began(self, *args: object) -> None:
            raise RuntimeError("broken observer")

        def drain_ended(self, *args: object) -> None:
            raise RuntimeError("broken observer")

    telemetry, clock = Telemetry(), ManualClock()
    runtime = Runtime(control_token=TOKEN, clock=clock, tracer_provider=telemetry.tracer_provider)
    runtime.drain.observe(Broken())
    with caplog.at_level(logging.ERROR, "forgezero_lifecycle.drain"):
        runtime.drain.begin(drain_body())
        assert await runtime.drain.wait() == "drained"
    assert [r.message for r in caplog.records].count("drain.observer_failed") == 2
    assert len(telemetry.spans()) == 1


class _FanOut:
    """Drain dependencies of a generation whose workers drain at once."""

    def drain_requests(self) -> None:
        pass

    async def wait_for_requests(self) -> None:
        pass

    async def stop_jobs(self, timeout_ms: int) -> None:
        pass

    def work_counters(self) -> Mapping[str, int]:
        return {"http": 0, "websocket": 0, "jobs": 0, "schedules": 0}

    async def sleep(self, ms: int) -> None:
        await asyncio.sleep(ms / 1000)

    def resume(self) -> None:
        pass


class _Generation:
    def __init__(self, number: int) -> None:
        self.number = number
        self.controller = DrainController(_FanOut())

    def in_flight(self) -> Any:
        from forgezero_lifecycle.wire.drain import WorkCounters

        return WorkCounters()


async def test_handover_span_steps_and_generation_drain_child() -> None:
    """A handover is a forgezero.handover span: the supervisor's steps are its events, the drain
    of the generation it retires is its child, an aborted one is an error."""
    telemetry = Telemetry()
    log = HandoverLog(tracer_provider=telemetry.tracer_provider)
    old = _Generation(1)
    log.trace_drains(old)  # type: ignore[arg-type]
    record = log.begin(1)
    record.to_generation = 2
    for action in (
        m.StartGeneration(2, workers=2),
        m.Accept(2, (0, 1), whole=True),
        m.StopAccepting(1),
        m.BeginDrain(1, target=2),
    ):
        log.step(action)
    old.controller.begin(drain_body() | {"sourceRevision": REVISION})
    assert await old.controller.wait() == "drained"
    record.end("done")
    log.step(m.Forget(1))  # no handover runs: nothing recorded
    [handover] = telemetry.spans("forgezero.handover")
    [drain] = telemetry.spans()
    assert [event.name for event in handover.events] == [
        "start generation",
        "accept",
        "stop accepting",
        "begin drain",
    ]
    assert dict(handover.events[1].attributes or {}) == {
        "forgezero.generation": 2,
        "forgezero.indexes": "0,1",
        "forgezero.whole": True,
    }
    assert dict(handover.attributes or {}) == {
        "forgezero.handover.number": 1,
        "forgezero.handover.from_generation": 1,
        "forgezero.handover.to_generation": 2,
        "forgezero.handover.state": "done",
    }
    assert drain.parent is not None
    assert drain.parent.span_id == handover.context.span_id
    assert dict(drain.attributes or {})["forgezero.generation"] == 1
    aborted = log.begin(2)
    aborted.end("aborted", "generation 3 did not start", "RUNTIME_HANDOVER_START_FAILED")
    span = telemetry.spans("forgezero.handover")[-1]
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["forgezero.handover.failure"] == (
        "RUNTIME_HANDOVER_START_FAILED"
    )


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_without_opentelemetry_nothing_changes() -> None:
    """Without opentelemetry-api a runtime imports none of it and drains as before; a tracer
    provider passed anyway is a configuration error naming the extra."""
    code = """
import asyncio, sys
sys.modules["opentelemetry"] = None  # as if the [otel] extra were not installed
import forgezero_lifecycle as f
runtime = f.Runtime(control_token="t" * 32)
async def main():
    runtime.drain.begin({"protocol": "forgezero-drain/v1", "nonce": "n" * 43,
        "sourceRevision": "a" * 40, "targetRevision": "b" * 40, "timeoutMs": 1000})
    print(await runtime.drain.wait())
asyncio.run(main())
print(sorted(m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m]))
try:
    f.Runtime(control_token="t" * 32, tracer_provider=object())
except f.ConfigurationError as error:
    print(error.code, "forgezero-lifecycle[otel]" in str(error))
"""
    assert _run(code).splitlines() == ["drained", "[]", "RUNTIME_CONFIG_INVALID True"]


def test_global_providers_by_default() -> None:
    """Without providers passed, the drain's span and the metrics go to the global ones, even
    when those are set after the runtime was built."""
    code = """
import asyncio
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import forgezero_lifecycle as f
runtime = f.Runtime(control_token="t" * 32, revision="c" * 40)
exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
async def main():
    runtime.drain.begin({"protocol": "forgezero-drain/v1", "nonce": "n" * 43,
        "sourceRevision": "c" * 40, "targetRevision": "b" * 40, "timeoutMs": 1000})
    await runtime.drain.wait()
asyncio.run(main())
print([s.name for s in exporter.get_finished_spans()])
names = {m.name for r in reader.get_metrics_data().resource_metrics
         for s in r.scope_metrics for m in s.metrics}
print(sorted(n for n in names if n.startswith("forgezero.")))
"""
    assert _run(code).splitlines() == [
        "['forgezero.drain']",
        "['forgezero.abandoned', 'forgezero.drain.duration', 'forgezero.in_flight', "
        "'forgezero.refused']",
    ]


def test_picture_of_a_drain_is_current() -> None:
    """docs/metrics.md's picture of a drain's trace is what the script draws from the
    in-memory exporter now (`python docs/_ext/drain_trace.py --write` redraws it)."""
    spec = importlib.util.spec_from_file_location("drain_trace", ROOT / "docs/_ext/drain_trace.py")
    assert spec is not None
    assert spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    page = ROOT / "docs" / "metrics.md"
    assert page.read_text() == script.rendered(page.read_text())
