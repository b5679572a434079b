"""Prometheus metrics of one runtime: a ``prometheus_client`` collector (the ``[metrics]`` extra).

::

    from prometheus_client import REGISTRY   # or your own CollectorRegistry
    from forgezero_lifecycle.metrics import RuntimeCollector

    REGISTRY.register(RuntimeCollector(runtime))    # your /metrics now includes the runtime's

or let the runtime serve it: ``Runtime(metrics=registry)`` registers the collector in
``registry`` and answers ``GET /.forgezero/runtime/metrics`` with that registry, without a token.

Nothing is counted for metrics on the request path: the collector reads, at scrape time, the
``statistics()`` of every part (the gate's in-flight counts and refusals, the drain
controller's, each job worker's and scheduler's, the handoff controller's) and the runtime's
``in_flight()``.

Every metric is listed in the README section "Metrics".
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final, Protocol, final, get_args

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .core.drain import DrainController, GenerationState
from .core.gate import IntakeGate
from .core.handoff import HandoffStatistics, StateHandoffController
from .core.participant import WorkParticipant
from .core.scheduler import SchedulerParticipant
from .jobs.worker import JobWorker
from .wire.drain import WorkCounters

__all__ = ["DURATION_BUCKETS", "PREFIX", "MetricsSource", "RuntimeCollector", "merge_expositions"]

PREFIX: Final = "forgezero"
#: Drain durations, in seconds: a deadline is 100 ms to 10 min.
DURATION_BUCKETS: Final = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_STATES: Final = get_args(GenerationState)
_KINDS: Final = ("http", "websocket", "jobs", "schedules")
_JOB_EVENTS: Final = (
    ("claimed", "claimed", "Durable jobs claimed by this process's workers."),
    ("completed", "completed", "Durable jobs completed (fenced, with the handler's writes)."),
    ("failed", "failed", "Durable job runs that failed (retried or dead)."),
    ("released", "released", "Durable jobs released on drain (fenced, attempt refunded)."),
    ("lease_lost", "lost", "Durable jobs whose lease was lost (another worker holds the fence)."),
)


class MetricsSource(Protocol):
    """What the collector reads (a :class:`~forgezero_lifecycle.runtime.Runtime`)."""

    @property
    def gate(self) -> IntakeGate: ...

    @property
    def drain(self) -> DrainController: ...

    @property
    def handoff(self) -> StateHandoffController[Any] | None: ...

    @property
    def participants(self) -> Sequence[WorkParticipant]: ...

    def in_flight(self) -> WorkCounters: ...


@final
class RuntimeCollector(Collector):
    """A custom collector: every metric is computed from the runtime's counters per scrape."""

    def __init__(self, runtime: MetricsSource, *, prefix: str = PREFIX) -> None:
        self._runtime = runtime
        self._prefix = prefix

    def collect(self) -> Iterator[Metric]:
        runtime = self._runtime
        yield from self._in_flight(runtime.in_flight())
        yield from self._drains(runtime.drain)
        yield from self._gate(runtime.gate)
        participants = list(runtime.participants)
        yield from self._jobs([p for p in participants if isinstance(p, JobWorker)])
        yield from self._schedules([p for p in participants if isinstance(p, SchedulerParticipant)])
        yield from self._handoff(runtime.handoff)

    def describe(self) -> Iterable[Metric]:
        # The same families, so a registry can refuse a second collector with the same names.
        return list(self.collect())

    def _name(self, name: str) -> str:
        return f"{self._prefix}_{name}"

    def _in_flight(self, counters: WorkCounters) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            self._name("in_flight"),
            "Admitted, unfinished work per kind (what a drain waits for).",
            labels=["kind"],
        )
        values = counters.model_dump()
        for kind in _KINDS:
            gauge.add_metric([kind], values[kind])
        yield gauge

    def _drains(self, drain: DrainController) -> Iterator[Metric]:
        stats = drain.statistics()
        state = GaugeMetricFamily(
            self._name("drain_state"),
            "1 for the state this generation is in (serving, draining, drained, failed).",
            labels=["state"],
        )
        for name in _STATES:
            state.add_metric([name], 1.0 if stats.state == name else 0.0)
        yield state
        yield CounterMetricFamily(
            self._name("drains_begun"), "Drains begun in this process.", value=stats.begun
        )
        ended = CounterMetricFamily(
            self._name("drains_ended"),
            "Drains ended, by outcome (rolled-back: rolled back while still draining).",
            labels=["outcome"],
        )
        for outcome, count in (
            ("drained", stats.drained),
            ("failed", stats.failed),
            ("rolled-back", stats.rolled_back),
        ):
            ended.add_metric([outcome], count)
        yield ended
        buckets: list[tuple[str, float]] = [
            (str(bound), sum(1 for d in stats.durations if d <= bound))
            for bound in DURATION_BUCKETS
        ]
        buckets.append(("+Inf", len(stats.durations)))
        histogram = HistogramMetricFamily(
            self._name("drain_duration_seconds"), "Seconds from drain begin to its end."
        )
        histogram.add_metric([], buckets, sum_value=sum(stats.durations))
        yield histogram

    def _gate(self, gate: IntakeGate) -> Iterator[Metric]:
        refused = CounterMetricFamily(
            self._name("refused"),
            "Requests and WebSockets refused with 503 / close because intake was closed.",
            labels=["kind"],
        )
        stats = gate.statistics()
        refused.add_metric(["http"], stats.refused_http)
        refused.add_metric(["websocket"], stats.refused_websocket)
        yield refused
        abandoned = CounterMetricFamily(
            self._name("abandoned"),
            "Requests and WebSockets still in flight at a drain's cutoff (sends still blocked then "
            "were given up, their connections abandoned).",
            labels=["kind"],
        )
        abandoned.add_metric(["http"], stats.cut_off_http)
        abandoned.add_metric(["websocket"], stats.cut_off_websocket)
        yield abandoned
        yield CounterMetricFamily(
            self._name("websockets_closed_at_grace"),
            "Open WebSockets closed by the drain when the stream grace ended.",
            value=stats.closed_at_grace,
        )

    def _jobs(self, workers: list[JobWorker[Any]]) -> Iterator[Metric]:
        stats = [worker.statistics() for worker in workers]
        for name, field, documentation in _JOB_EVENTS:
            total = sum(getattr(s, field) for s in stats)
            yield CounterMetricFamily(self._name(f"jobs_{name}"), documentation, value=total)

    def _schedules(self, schedulers: list[SchedulerParticipant]) -> Iterator[Metric]:
        runs = CounterMetricFamily(
            self._name("schedule_runs"), "Runs of each scheduled job.", labels=["job"]
        )
        failures = CounterMetricFamily(
            self._name("schedule_failures"), "Failed runs of each scheduled job.", labels=["job"]
        )
        consecutive = GaugeMetricFamily(
            self._name("schedule_consecutive_failures"),
            "Failures of each scheduled job since its last success.",
            labels=["job"],
        )
        for participant in schedulers:
            for job in participant.scheduler.statistics().jobs:
                runs.add_metric([job.name], job.runs)
                failures.add_metric([job.name], job.failures)
                consecutive.add_metric([job.name], job.consecutive_failures)
        yield from (runs, failures, consecutive)

    def _handoff(self, handoff: StateHandoffController[Any] | None) -> Iterator[Metric]:
        stats = handoff.statistics() if handoff is not None else HandoffStatistics()
        yield CounterMetricFamily(
            self._name("handoff_exports"),
            "State envelopes served to a next generation.",
            value=stats.exported,
        )
        yield CounterMetricFamily(
            self._name("handoff_export_bytes"),
            "Bytes of the state envelopes served.",
            value=stats.exported_bytes,
        )
        outcomes = CounterMetricFamily(
            self._name("handoffs"),
            "State handoffs into this generation, by outcome.",
            labels=["outcome"],
        )
        outcomes.add_metric(["acknowledged"], stats.acknowledged)
        outcomes.add_metric(["failed"], stats.failed)
        yield outcomes


def merge_expositions(expositions: Sequence[tuple[dict[str, str], bytes]]) -> bytes:
    """One exposition of several processes' scrapes, each sample labelled with its process.

    ``serve --workers N`` answers ``/.forgezero/runtime/metrics`` for the whole generation: every
    worker's own scrape (text format), with the worker's labels (``worker``, ``pid``) added to
    each of its samples, grouped by metric family. A dashboard sums them with ``sum without
    (worker, pid) (...)``.
    """
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.samples import Sample

    merged: dict[str, Metric] = {}
    for labels, text in expositions:
        for family in text_string_to_metric_families(text.decode("utf-8")):
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation, family.type)
            into.samples.extend(
                Sample(sample.name, {**sample.labels, **labels}, sample.value, sample.timestamp)
                for sample in family.samples
            )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(merged.values())))
    return generate_latest(registry)


@final
class _Fixed(Collector):
    """A collector of families already made."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return iter(self._families)
