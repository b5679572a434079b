"""A drain written down as a trace span would hold it, without any tracing library.

:class:`DrainRecorder` observes a :class:`~.drain.DrainController` (begin and end) and, when one
is given, the :class:`~.gate.IntakeGate` (the moments in between), and keeps each drain as a
:class:`DrainRecord`: when it began and ended, its attributes, and one event per phase it
passed. When the drain ends the record is handed on (:mod:`forgezero_lifecycle.otel` turns it
into a ``forgezero.drain`` span), so OpenTelemetry is imported only once a drain has ended, and
nothing is done on the request path.

Times are the runtime's own clock, anchored to the wall clock once (span times are
nanoseconds since the epoch): a test on a manual clock gets the same record every run.

The attributes never hold a token, and a nonce only as its first eight characters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, final

from .._clock import Clock
from .._events import nonce_prefix
from .drain import DrainController, DrainEnd, DrainOrigin
from .gate import DrainMoment, IntakeGate

if TYPE_CHECKING:
    from ..wire.drain import DrainRequest, WorkCounters

__all__ = ["PHASE_EVENTS", "Attributes", "DrainRecord", "DrainRecorder"]

Attributes = dict[str, str | int | float | bool]

#: The event each gate moment adds to the drain's record.
PHASE_EVENTS: Final[dict[DrainMoment, str]] = {
    "draining": "readiness off",
    "closed": "intake closed",
    "notice": "stream notice",
    "cutoff": "cutoff",
}
#: The event that ends the record, per outcome.
_END_EVENTS: Final[dict[DrainEnd, str]] = {
    "drained": "drained",
    "failed": "failed",
    "rolled-back": "rolled back",
}


@final
@dataclass(slots=True)
class DrainRecord:
    """One drain: what a ``forgezero.drain`` span is made of."""

    started_ns: int
    attributes: Attributes
    events: list[tuple[str, int, Attributes]] = field(default_factory=list)
    ended_ns: int | None = None
    outcome: DrainEnd | None = None
    failure: str | None = None
    seconds: float = 0.0
    #: What ``parent`` returned when the drain began (a tracing context), or None.
    parent: object = None


@final
class DrainRecorder:
    """Keeps the running drain of ``controller`` as a :class:`DrainRecord`; ``on_end`` gets it."""

    def __init__(
        self,
        controller: DrainController,
        *,
        clock: Clock,
        on_end: Callable[[DrainRecord], None],
        gate: IntakeGate | None = None,
        in_flight: Callable[[], WorkCounters] | None = None,
        attributes: Attributes | None = None,
        parent: Callable[[], object] | None = None,
    ) -> None:
        self._clock = clock
        self._anchor = (time.time_ns(), clock.monotonic())
        self._on_end = on_end
        self._gate = gate
        self._in_flight = in_flight
        self._attributes = dict(attributes or {})
        self._parent = parent
        #: The drain running now (None between drains).
        self.current: DrainRecord | None = None
        controller.observe(self)
        if gate is not None:
            gate.watch(self._moment)

    def now_ns(self) -> int:
        """The runtime clock's now, as nanoseconds since the epoch."""
        wall, monotonic = self._anchor
        return wall + round((self._clock.monotonic() - monotonic) * 1e9)

    def drain_began(self, request: DrainRequest, origin: DrainOrigin) -> None:
        self.current = DrainRecord(
            self.now_ns(),
            {
                **self._attributes,
                "forgezero.drain.nonce_prefix": nonce_prefix(request.nonce),
                "forgezero.drain.source_revision": request.source_revision,
                "forgezero.drain.target_revision": request.target_revision,
                "forgezero.drain.timeout_ms": request.timeout_ms,
                "forgezero.drain.origin": origin,
            },
            parent=None if self._parent is None else self._parent(),
        )

    def _moment(self, moment: DrainMoment) -> None:
        record = self.current
        if record is None:
            return
        attributes: Attributes = {}
        if moment in ("notice", "cutoff") and self._gate is not None:
            still = self._gate.statistics()
            attributes = {
                "forgezero.in_flight.http": still.http,
                "forgezero.in_flight.websocket": still.websocket,
            }
        record.events.append((PHASE_EVENTS[moment], self.now_ns(), attributes))

    def drain_ended(self, outcome: DrainEnd, failure: str | None, seconds: float) -> None:
        record, self.current = self.current, None
        if record is None:
            return
        ended = self.now_ns()
        final: Attributes = {"forgezero.drain.outcome": outcome}
        if failure is not None:
            final["forgezero.drain.failure"] = failure
        if self._in_flight is not None:
            for kind, count in self._in_flight().model_dump().items():
                final[f"forgezero.drain.in_flight.{kind}"] = count
        record.attributes.update(final)
        event: Attributes = {} if failure is None else {"forgezero.drain.failure": failure}
        record.events.append((_END_EVENTS[outcome], ended, event))
        record.ended_ns, record.outcome, record.failure = ended, outcome, failure
        record.seconds = seconds
        self._on_end(record)
