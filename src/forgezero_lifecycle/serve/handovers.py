"""The supervisor's record of its handovers, which ``supervisor/v1/handover`` answers from.

Each reload (SIGHUP or ``POST supervisor/v1/reload``) begins one :class:`Handover`, numbered from
1; it is ``running`` until generation g+1 serves and g is gone (``done``), or until g+1 could not
start, could not take g's state or did not prove it serves and g serves on, or until the stop
ended it (``aborted``, with a code and the reason). The most recent
:data:`RECENT` are kept, so ``forgezero-lifecycle reload`` can wait for the one it began even if
another reload follows.

With ``opentelemetry-api`` installed (the ``[otel]`` extra) each handover is also a span
``forgezero.handover`` on the global tracer provider: one event per step the supervisor takes
while it runs (``start generation``, ``accept``, ``prove``, ``stop accepting``, ``begin
drain``...), and the drain of the generation it retires (the supervisor's drain over every
worker) as its child ``forgezero.drain`` (:mod:`forgezero_lifecycle.otel`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, final

from .._clock import SystemClock
from ..wire.supervisor import HandoverFailure, HandoverState, HandoverStatus

if TYPE_CHECKING:
    from opentelemetry.trace import Span, TracerProvider

    from .workers import Generation

__all__ = ["RECENT", "Handover", "HandoverLog"]

#: Handovers kept for ``supervisor/v1/handover``.
RECENT: Final = 16


@final
@dataclass
class Handover:
    """One handover, from generation ``from_generation``."""

    number: int
    from_generation: int
    to_generation: int | None = None
    state: HandoverState = "running"
    failure: HandoverFailure | None = None
    detail: str | None = None
    seconds: float | None = None
    _began: float = field(default_factory=time.monotonic, repr=False)
    #: Its ``forgezero.handover`` span while it runs (None without OpenTelemetry).
    span: Span | None = field(default=None, repr=False)

    def end(
        self,
        state: HandoverState,
        detail: str | None = None,
        failure: HandoverFailure | None = None,
    ) -> None:
        self.state = state
        self.failure = failure
        self.detail = detail
        self.seconds = round(time.monotonic() - self._began, 3)
        span, self.span = self.span, None
        if span is not None:
            from opentelemetry.trace import Status, StatusCode

            if self.to_generation is not None:
                span.set_attribute("forgezero.handover.to_generation", self.to_generation)
            span.set_attribute("forgezero.handover.state", state)
            if failure is not None:
                span.set_attribute("forgezero.handover.failure", failure)
            if state == "aborted":
                span.set_status(Status(StatusCode.ERROR, detail))
            span.end()

    def wire(self) -> dict[str, Any]:
        """The ``supervisor/v1/handover`` answer, a :class:`HandoverStatus`."""
        return HandoverStatus(
            handover=self.number,
            state=self.state,
            from_generation=self.from_generation,
            to_generation=self.to_generation,
            failure=self.failure,
            detail=self.detail,
            seconds=self.seconds,
        ).model_dump(mode="json")


@final
class HandoverLog:
    """The supervisor's recent handovers, newest last."""

    def __init__(self, *, tracer_provider: TracerProvider | None = None) -> None:
        self._recent: deque[Handover] = deque(maxlen=RECENT)
        self._begun = 0
        self._tracer_provider = tracer_provider
        self._otel = _otel()

    def begin(self, from_generation: int) -> Handover:
        self._begun += 1
        handover = Handover(self._begun, from_generation)
        if self._otel is not None:
            handover.span = self._otel.handover_span(
                handover.number, from_generation, self._tracer_provider
            )
        self._recent.append(handover)
        return handover

    def running_span(self) -> Span | None:
        """The span of the handover running now, or None."""
        latest = self._recent[-1] if self._recent else None
        return latest.span if latest is not None and latest.state == "running" else None

    def step(self, action: object) -> None:
        """Add the supervisor's ``action`` to the running handover's span as an event."""
        span = self.running_span()
        if span is not None and self._otel is not None:
            name, attributes = self._otel.step_event(action)
            span.add_event(name, attributes)

    def trace_drains(self, generation: Generation) -> None:
        """Every drain of ``generation`` as a span, the child of the handover that began it."""
        if self._otel is not None:
            self._otel.trace_drains(
                generation.controller,
                clock=SystemClock(),
                attributes={"forgezero.generation": generation.number},
                parent=self.running_span,
                in_flight=generation.in_flight,
                tracer_provider=self._tracer_provider,
            )

    def find(self, number: int | None = None) -> Handover | None:
        """Handover ``number``, or the latest when it is None; None when not (or no longer) kept."""
        if number is None:
            return self._recent[-1] if self._recent else None
        return next((h for h in self._recent if h.number == number), None)


def _otel() -> ModuleType | None:
    """:mod:`forgezero_lifecycle.otel` when OpenTelemetry's API is installed, else None."""
    try:
        from .. import otel
    except ImportError as error:
        if not (error.name or "").startswith("opentelemetry"):
            raise
        return None
    return otel
