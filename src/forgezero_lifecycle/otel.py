"""OpenTelemetry for a runtime (the ``[otel]`` extra: ``opentelemetry-api``; the SDK is yours).

With ``opentelemetry-api`` installed, every :class:`~forgezero_lifecycle.runtime.Runtime` does
this by itself, on the global providers (or the ones passed as ``Runtime(tracer_provider=...,
meter_provider=...)``); without it nothing is imported and nothing changes.

Traces: each drain is a span ``forgezero.drain``, from its begin to drained, failed or rolled
back, with an event per phase it passed (``readiness off``, ``intake closed``, ``stream
notice``, ``cutoff``, then ``drained`` / ``failed`` / ``rolled back``), and attributes:

* ``forgezero.revision``, ``forgezero.drain.source_revision``, ``forgezero.drain.target_revision``;
* ``forgezero.drain.nonce_prefix`` (the nonce's first 8 characters: never the whole nonce, never a
  token), ``forgezero.drain.timeout_ms`` (the deadline), ``forgezero.drain.origin``
  (``control`` or ``signal``);
* at the end: ``forgezero.drain.outcome``, ``forgezero.drain.failure`` (its code) and the counts
  still in flight, ``forgezero.drain.in_flight.{http,websocket,jobs,schedules}``.

A failed drain's span has status ``ERROR``. The span is made when the drain ends, from what
:class:`~forgezero_lifecycle.core.drain_record.DrainRecorder` wrote down on the runtime's clock
(its start and event times are the drain's own), so ``opentelemetry.trace`` is imported only
then, and exporters see it when they see any span: once it ended. A drain has no parent span;
under ``serve --workers`` each handover is a span ``forgezero.handover``
(:class:`forgezero_lifecycle.serve.supervisor.HandoverLog`) whose steps are events and whose generation's drain
(the supervisor's, over every worker) is its child. Each worker's own ``forgezero.drain`` span
is a root in that worker's process: the supervisor's channel carries no trace context.

Metrics, read from the runtime's statistics when the meter provider collects (nothing is counted
on the request path), each with the attribute ``forgezero.revision``:

==============================  ===============  ==========================================
``forgezero.in_flight``         up-down counter  admitted, unfinished work, by ``kind``
``forgezero.refused``           counter          refused while draining, by ``kind``
``forgezero.abandoned``         counter          in flight at a drain's cutoff, by ``kind``
``forgezero.drain.duration``    histogram (s)    begin to end, by ``forgezero.drain.outcome``
==============================  ===============  ==========================================
"""

from __future__ import annotations

import dataclasses
import re
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final, Protocol, final

from opentelemetry import metrics

from ._clock import Clock
from ._version import __version__
from .core.drain import DrainController
from .core.drain_record import Attributes, DrainRecord, DrainRecorder

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
    from opentelemetry.trace import Span, TracerProvider

    from .core.gate import IntakeGate
    from .wire.drain import WorkCounters

__all__ = [
    "INSTRUMENTATION",
    "RuntimeTelemetry",
    "drain_span",
    "handover_span",
    "step_event",
    "trace_drains",
]

#: The instrumentation scope of every span and metric.
INSTRUMENTATION: Final = "forgezero_lifecycle"
_KINDS: Final = ("http", "websocket", "jobs", "schedules")


class Runtime(Protocol):
    """What the telemetry reads of a :class:`~forgezero_lifecycle.runtime.Runtime`."""

    revision: str | None

    @property
    def gate(self) -> IntakeGate: ...

    @property
    def drain(self) -> DrainController: ...

    def in_flight(self) -> WorkCounters: ...


@final
class RuntimeTelemetry:
    """A runtime's drains as spans and its statistics as metrics (built by ``Runtime``)."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        clock: Clock,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self._tracer_provider = tracer_provider
        revision = runtime.revision or "unknown"
        self._revision: Attributes = {"forgezero.revision": revision}
        meter = metrics.get_meter(INSTRUMENTATION, __version__, meter_provider=meter_provider)
        # The callbacks hold the runtime weakly: a provider outlives the runtimes it observed.
        source = weakref.ref(runtime)
        meter.create_observable_up_down_counter(
            "forgezero.in_flight",
            [_observe(source, self._revision, _in_flight)],
            unit="{unit}",
            description="Admitted, unfinished work per kind (what a drain waits for).",
        )
        meter.create_observable_counter(
            "forgezero.refused",
            [_observe(source, self._revision, _refused)],
            unit="{unit}",
            description="Requests and WebSockets refused because intake was closed.",
        )
        meter.create_observable_counter(
            "forgezero.abandoned",
            [_observe(source, self._revision, _abandoned)],
            unit="{unit}",
            description="Requests and WebSockets still in flight at a drain's cutoff: sends "
            "still blocked then were given up and their connections abandoned.",
        )
        self._duration = meter.create_histogram(
            "forgezero.drain.duration",
            unit="s",
            description="Seconds from a drain's begin to drained, failed or rolled back.",
        )
        self.recorder = DrainRecorder(
            runtime.drain,
            clock=clock,
            on_end=self._ended,
            gate=runtime.gate,
            in_flight=runtime.in_flight,
            attributes=self._revision,
        )

    def _ended(self, record: DrainRecord) -> None:
        outcome = record.outcome or "failed"
        self._duration.record(
            record.seconds, {**self._revision, "forgezero.drain.outcome": outcome}
        )
        drain_span(record, self._tracer_provider)


def _observe(
    source: weakref.ref[Runtime],
    attributes: Attributes,
    read: Callable[[Runtime], Iterable[tuple[str, int]]],
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        runtime = source()
        if runtime is None:
            return []
        return [
            metrics.Observation(value, {**attributes, "kind": kind})
            for kind, value in read(runtime)
        ]

    return callback


def _in_flight(runtime: Runtime) -> Iterable[tuple[str, int]]:
    counters: WorkCounters = runtime.in_flight()
    return [(kind, getattr(counters, kind)) for kind in _KINDS]


def _refused(runtime: Runtime) -> Iterable[tuple[str, int]]:
    stats = runtime.gate.statistics()
    return [("http", stats.refused_http), ("websocket", stats.refused_websocket)]


def _abandoned(runtime: Runtime) -> Iterable[tuple[str, int]]:
    stats = runtime.gate.statistics()
    return [("http", stats.cut_off_http), ("websocket", stats.cut_off_websocket)]


def drain_span(record: DrainRecord, tracer_provider: TracerProvider | None = None) -> None:
    """Emit ``record`` (a drain that ended) as a ``forgezero.drain`` span: its own start, event
    and end times; a child of ``record.parent`` when that is a span."""
    from opentelemetry import trace

    tracer = trace.get_tracer(INSTRUMENTATION, __version__, tracer_provider=tracer_provider)
    parent = record.parent
    context = trace.set_span_in_context(
        parent if isinstance(parent, trace.Span) else trace.INVALID_SPAN
    )
    span = tracer.start_span(
        "forgezero.drain",
        context=context,
        start_time=record.started_ns,
        attributes=record.attributes,
    )
    for name, at, attributes in record.events:
        span.add_event(name, attributes, timestamp=at)
    if record.outcome == "failed":
        span.set_status(trace.Status(trace.StatusCode.ERROR, record.failure))
    span.end(end_time=record.ended_ns)


def handover_span(
    number: int, from_generation: int, tracer_provider: TracerProvider | None = None
) -> Span:
    """Start the span ``forgezero.handover`` of handover ``number`` (ended by its caller)."""
    from opentelemetry import trace

    tracer = trace.get_tracer(INSTRUMENTATION, __version__, tracer_provider=tracer_provider)
    return tracer.start_span(
        "forgezero.handover",
        context=trace.set_span_in_context(trace.INVALID_SPAN),
        attributes={
            "forgezero.handover.number": number,
            "forgezero.handover.from_generation": from_generation,
        },
    )


def trace_drains(
    controller: DrainController,
    *,
    clock: Clock,
    attributes: Attributes,
    parent: Callable[[], object],
    in_flight: Callable[[], WorkCounters] | None = None,
    tracer_provider: TracerProvider | None = None,
) -> DrainRecorder:
    """Every drain of ``controller`` as a ``forgezero.drain`` span, the child of what ``parent``
    returns when it begins (a span, or None: a root), e.g. a generation's drain under the
    handover that began it."""
    return DrainRecorder(
        controller,
        clock=clock,
        on_end=lambda record: drain_span(record, tracer_provider),
        in_flight=in_flight,
        attributes=attributes,
        parent=parent,
    )


_WORD: Final = re.compile(r"(?<!^)(?=[A-Z])")


def step_event(action: object) -> tuple[str, Attributes]:
    """A supervisor action as a handover step event: its name in words (``StopAccepting`` is
    ``stop accepting``) and its plain fields (generation, indexes...) as attributes."""
    name = _WORD.sub(" ", type(action).__name__).lower()
    attributes: Attributes = {}
    if dataclasses.is_dataclass(action):
        for field in dataclasses.fields(action):
            value = getattr(action, field.name)
            if isinstance(value, str | int | float | bool):
                attributes[f"forgezero.{field.name}"] = value
            elif isinstance(value, tuple) and all(isinstance(v, int) for v in value):
                attributes[f"forgezero.{field.name}"] = ",".join(map(str, value))
    return name, attributes
