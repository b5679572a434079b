"""The drain state machine: ``RuntimeDrainController`` plus rollback.

The controller is the JavaScript `@forgezero/runtime` lifecycle module's, with rollback added.

::

    serving ──begin──▶ draining ──work done & every counter 0──▶ drained
       ▲                  │  └──deadline / dependency error / not idle──▶ failed
       └────rollback──────┴───────────────────────────────────────────┘

``begin()`` never blocks: it validates, records the request, calls ``drain_requests()`` (which
closes every kind of intake in one synchronous step), starts ``wait_for_requests()`` and
``stop_jobs(timeout_ms)``, and races them against ``sleep(timeout_ms)`` in a task the controller
owns. One controller serves one process: a second nonce cannot replace a running drain, while an
exact retry is acknowledged as a duplicate.

The controller imports nothing it controls; everything arrives through :class:`DrainDependencies`.

Port rules D1-D9 are listed in ``tests/conformance/vectors.json``, ``meta.format_notes.port_rules``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, final

from .._clock import Clock, SystemClock
from .._errors import DrainConflictError, DrainFailedError, DrainNotFoundError, LifecycleError
from .._events import emit, nonce_prefix
from .._race import first
from ..wire._protocol import DrainState, is_nonce

if TYPE_CHECKING:
    # The wire models (pydantic) are imported by the methods that need them, on the first drain
    # request: a runtime that is never drained does not load pydantic.
    from ..wire.accepted import Accepted
    from ..wire.drain import DrainRequest, DrainStatus, WorkCounters

__all__ = [
    "DrainController",
    "DrainDependencies",
    "DrainEnd",
    "DrainObserver",
    "DrainOrigin",
    "DrainStatistics",
    "GenerationState",
]

logger = logging.getLogger("forgezero_lifecycle.drain")

MAX_FAILURE_CODE_POINTS: Final = 128

#: Where this generation stands: ``serving`` before any drain and after a rollback. A drain's
#: wire status is the same value, except that a rolled-back drain reports ``rolled-back``.
GenerationState = Literal["serving", "draining", "drained", "failed"]

#: Where a drain came from: a drain request on the control plane, or a signal the process got.
DrainOrigin = Literal["control", "signal"]


class DrainDependencies(Protocol):
    """What the controller drives (the JavaScript module's ``RuntimeDrainDependencies`` plus
    ``resume``)."""

    def drain_requests(self) -> None:
        """Atomically refuse all new HTTP, WebSocket, job and schedule intake."""

    def wait_for_requests(self) -> Awaitable[None]:
        """Complete once all already-admitted HTTP and WebSocket work is closed."""

    def stop_jobs(self, timeout_ms: int) -> Awaitable[None]:
        """Stop schedule intake and wait for (or release) already-leased durable jobs."""

    def work_counters(self) -> WorkCounters | Mapping[str, object]:
        """A live, non-secret snapshot; every counter must reach zero before drained."""

    def sleep(self, ms: int) -> Awaitable[None]:
        """A monotonic wait, injectable so tests drive the deadline."""

    def resume(self) -> None:
        """Reopen every kind of intake (rollback)."""


#: How a drain ended: what :meth:`DrainObserver.drain_ended` is told.
DrainEnd = Literal["drained", "failed", "rolled-back"]


class DrainObserver(Protocol):
    """Told when a drain begins and ends (tracing: :mod:`forgezero_lifecycle.otel`).

    Called synchronously by the controller; an observer that raises is logged and ignored, the
    drain goes on.
    """

    def drain_began(self, request: DrainRequest, origin: DrainOrigin) -> None:
        """A drain begins: called before its first step (readiness off) is taken."""

    def drain_ended(self, outcome: DrainEnd, failure: str | None, seconds: float) -> None:
        """The drain ended ``outcome`` (a rollback only while it was still draining)."""


@final
@dataclass(frozen=True, slots=True)
class DrainStatistics:
    """A snapshot of this process's drains, for metrics (nothing in it is secret)."""

    #: ``serving`` when no drain holds intake closed (none yet, or the last one rolled back).
    state: GenerationState
    begun: int
    drained: int
    failed: int
    #: Drains rolled back while still draining (a rollback after drained/failed ends nothing).
    rolled_back: int
    #: Seconds from begin to drained, failed or rolled back, one entry per ended drain.
    durations: tuple[float, ...]


@final
class DrainController:
    """One drain per process, observable through :meth:`status`, reversible by :meth:`rollback`."""

    def __init__(
        self,
        dependencies: DrainDependencies,
        *,
        revision: str | None = None,
        clock: Clock | None = None,
        detail: Callable[[], dict[str, Any] | None] | None = None,
        admit: Callable[[DrainOrigin], None] | None = None,
    ) -> None:
        self._deps = dependencies
        self._detail = detail
        #: Raises a :class:`LifecycleError` to refuse a new drain before anything changes.
        self._admit = admit
        self._revision = revision
        # Measures the drain (events, metrics, remaining()); the deadline fires by deps.sleep,
        # which the runtime runs on this same clock.
        self._clock: Clock = clock or SystemClock()
        self._began_at = 0.0
        # Plain ints, touched once per drain, read at scrape time (statistics()).
        self._ended = {"drained": 0, "failed": 0, "rolled-back": 0}
        self._begun = 0
        self._durations: list[float] = []
        # The last drain begun (kept after a rollback, so its nonce is still found by status).
        self._request: DrainRequest | None = None
        self._origin: DrainOrigin = "control"
        self._state: GenerationState = "serving"
        self._failure: str | None = None
        self._retired_nonces: set[str] = set()
        # The running drain's race and the two futures it races; a rollback cancels all three.
        self._running: tuple[asyncio.Future[None], ...] = ()
        self._settled = asyncio.Event()
        self._observers: list[DrainObserver] = []

    def observe(self, observer: DrainObserver) -> None:
        """Tell ``observer`` when each drain begins and ends, from now on."""
        self._observers.append(observer)

    @property
    def revision(self) -> str | None:
        """The revision ``sourceRevision`` must match (None: any)."""
        return self._revision

    @revision.setter
    def revision(self, revision: str | None) -> None:
        # A supervisor learns its generation's revision once the workers have reported it.
        self._revision = revision

    @property
    def active(self) -> bool:
        """True while a drain holds intake closed (draining, drained or failed)."""
        return self._state != "serving"

    @property
    def state(self) -> DrainState | None:
        """The last drain's wire status, or None before the first drain."""
        return None if self._request is None else self._drain_status()

    @property
    def origin(self) -> DrainOrigin:
        """Where the last drain begun came from (``control`` before the first drain)."""
        return self._origin

    @property
    def timeout(self) -> float:
        """Seconds the last drain begun may take (its ``timeoutMs``); 0 before the first drain."""
        return 0.0 if self._request is None else self._request.timeout_ms / 1000

    def elapsed(self) -> float:
        """Seconds since the last drain began, on the controller's clock."""
        return self._clock.monotonic() - self._began_at

    def remaining(self) -> float:
        """Seconds left until the last drain's deadline (0 once it has passed)."""
        return max(0.0, self.timeout - self.elapsed())

    def _drain_status(self) -> DrainState:
        # Serving again with a drain on record: that drain was rolled back.
        return "rolled-back" if self._state == "serving" else self._state

    def _conflict(self) -> str:
        if self._state == "draining":
            return "a drain with another nonce is running; poll it or roll it back"
        ended = "drained" if self._state == "drained" else f"failed ({self._failure})"
        return (
            f"this generation's drain already ended {ended} and intake stays closed; roll that "
            "drain back to serve again before beginning another"
        )

    def begin(self, request: object, *, origin: DrainOrigin = "control") -> Accepted:
        """Start draining, or acknowledge an exact retry of the running drain.

        ``origin`` says where the request came from; the dependencies read it as
        :attr:`origin` while the drain runs (a process's own signal passes ``signal``).
        """
        from ..wire.accepted import Accepted
        from ..wire.drain import parse_drain_request

        parsed = parse_drain_request(request)
        if self._revision is not None and parsed.source_revision != self._revision:
            raise DrainConflictError(
                "RUNTIME_DRAIN_REVISION_MISMATCH",
                detail="sourceRevision is not the revision this generation runs",
            )
        if self.active:
            assert self._request is not None
            if not self._request.same_drain(parsed):
                raise DrainConflictError("RUNTIME_DRAIN_ALREADY_STARTED", detail=self._conflict())
            return Accepted(duplicate=True)
        if parsed.nonce in self._retired_nonces:
            raise DrainConflictError(
                "RUNTIME_DRAIN_ALREADY_STARTED",
                detail="this nonce was rolled back; begin again with a fresh nonce",
            )
        if self._admit is not None:
            self._admit(origin)
        self._request = parsed
        self._origin = origin
        self._state = "draining"
        self._failure = None
        self._settled = asyncio.Event()
        self._began_at = self._clock.monotonic()
        self._begun += 1
        emit(
            logger,
            logging.INFO,
            "drain.begin",
            nonce_prefix=nonce_prefix(parsed.nonce),
            source_revision=parsed.source_revision,
            target_revision=parsed.target_revision,
            timeout_ms=parsed.timeout_ms,
            origin=origin,
        )
        for observer in self._observers:
            _tell(observer.drain_began, parsed, origin)
        self._start(parsed.timeout_ms)
        return Accepted(duplicate=False)

    def status(self, nonce: object) -> DrainStatus:
        """The drain's progress; unknown or malformed nonces are not found."""
        from ..wire.drain import DrainStatus, validate_counters

        request = self._find(nonce)
        return DrainStatus(
            **request.model_dump(),
            status=self._drain_status(),
            in_flight=validate_counters(self._deps.work_counters()),
            failure=self._failure,
            detail=None if self._detail is None else self._detail(),
        )

    def current(self) -> DrainStatus:
        """The running drain's status, nonce included, for a caller who does not know the nonce.

        A drain is running from ``begin`` until it is rolled back (drained and failed included:
        intake stays closed); otherwise the generation is serving and there is none.
        """
        if not self.active:
            raise DrainNotFoundError(
                detail="no drain is running: this generation is serving "
                "(a rolled-back drain is still found by status with its nonce)"
            )
        assert self._request is not None
        return self.status(self._request.nonce)

    def rollback(self, nonce: object) -> DrainStatus:
        """Return a draining, drained or failed generation to serving."""
        request = self._find(nonce)
        if self._state != "serving":
            for running in self._running:
                running.cancel()  # a no-op on one that is done
            self._running = ()
            self._deps.resume()
            rolled_from = self._state
            if rolled_from == "draining":
                self._count_end("rolled-back")
            self._state = "serving"
            self._failure = None
            self._retired_nonces.add(request.nonce)
            self._settled.set()
            emit(
                logger,
                logging.INFO,
                "drain.rollback",
                nonce_prefix=nonce_prefix(request.nonce),
                rolled_from=rolled_from,
                elapsed_s=self._elapsed(),
            )
        return self.status(request.nonce)

    async def wait(self) -> DrainState:
        """Wait until the current drain leaves ``draining``; returns the state it reached."""
        await self._settled.wait()
        return self._drain_status()

    def _find(self, nonce: object) -> DrainRequest:
        if nonce is None:
            raise DrainNotFoundError(detail="the nonce is required")
        if not is_nonce(nonce):
            raise DrainNotFoundError(detail="the nonce must be 43 base64url characters")
        if self._request is None or nonce != self._request.nonce:
            raise DrainNotFoundError(detail="no drain with this nonce")
        return self._request

    def _start(self, timeout_ms: int) -> None:
        # The dependencies are called here, synchronously and in the JavaScript module's order, so
        # that the intake is closed when begin() returns; a dependency that throws fails the drain
        # (RUNTIME_DRAIN_FAILED, its message not reported) and no later dependency is called.
        started: list[Awaitable[None]] = []
        try:
            self._deps.drain_requests()
            started.append(self._deps.wait_for_requests())
            started.append(self._deps.stop_jobs(timeout_ms))
        except Exception:
            logger.exception("drain.dependency_failed")
            for awaitable in started:
                _discard(awaitable)
            self._finish("failed", "RUNTIME_DRAIN_FAILED")
            return
        work = asyncio.ensure_future(_all(started))
        # A rollback in the same step as begin cancels the work before it ran: close the steps'
        # coroutines then (a no-op on those that ran), so none is left never awaited.
        work.add_done_callback(lambda _: _discard_all(started))
        deadline = asyncio.ensure_future(self._deps.sleep(timeout_ms))
        self._running = (asyncio.create_task(self._race(work, deadline)), work, deadline)

    async def _race(self, work: asyncio.Future[None], deadline: asyncio.Future[None]) -> None:
        from ..wire.drain import validate_counters

        try:
            outcome = await first(work, deadline)  # a deadline that raises fails with its error
            if outcome.cancelled():
                raise DrainFailedError("RUNTIME_DRAIN_TIMEOUT")
            if outcome.exception() is not None:
                raise DrainFailedError("RUNTIME_DRAIN_FAILED") from outcome.exception()
            counters = validate_counters(self._deps.work_counters())
            if not counters.idle:
                raise DrainFailedError("RUNTIME_DRAIN_NOT_IDLE")
            self._finish("drained", None)
        except Exception as cause:  # CancelledError is a BaseException: a rollback passes
            self._finish("failed", _failure_text(cause))

    def statistics(self) -> DrainStatistics:
        """Counts of drains begun and ended by outcome, their durations, and the state now."""
        return DrainStatistics(
            state=self._state,
            begun=self._begun,
            drained=self._ended["drained"],
            failed=self._ended["failed"],
            rolled_back=self._ended["rolled-back"],
            durations=tuple(self._durations),
        )

    def _count_end(self, outcome: DrainEnd) -> None:
        self._ended[outcome] += 1
        seconds = self.elapsed()
        self._durations.append(seconds)
        for observer in self._observers:
            _tell(observer.drain_ended, outcome, self._failure, seconds)

    def _finish(self, state: Literal["drained", "failed"], failure: str | None) -> None:
        from ..wire.drain import validate_counters

        self._state = state
        self._failure = failure
        self._settled.set()
        self._count_end(state)
        assert self._request is not None
        prefix = nonce_prefix(self._request.nonce)
        if state == "drained":
            emit(
                logger,
                logging.INFO,
                "drain.drained",
                nonce_prefix=prefix,
                elapsed_s=self._elapsed(),
            )
            return
        try:
            left = self._deps.work_counters()
            counters = validate_counters(left).model_dump()
        except Exception:  # a counter error is the failure itself; the event still goes out
            counters = {}
        emit(
            logger,
            logging.WARNING,
            "drain.failed",
            nonce_prefix=prefix,
            failure=failure,
            elapsed_s=self._elapsed(),
            **counters,
        )

    def _elapsed(self) -> float:
        return round(self.elapsed(), 3)


def _tell(callback: Callable[..., None], *args: object) -> None:
    try:
        callback(*args)
    except Exception:  # an observer never stops a drain
        logger.exception("drain.observer_failed")


async def _all(awaitables: list[Awaitable[None]]) -> None:
    # One group: when one step fails, the others are cancelled instead of running on unseen.
    async with asyncio.TaskGroup() as group:
        for awaitable in awaitables:
            group.create_task(_wait(awaitable))


async def _wait(awaitable: Awaitable[None]) -> None:
    await awaitable


def _discard(awaitable: Awaitable[None]) -> None:
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()  # an un-awaited coroutine: close it so it does not warn


def _discard_all(awaitables: list[Awaitable[None]]) -> None:
    for awaitable in awaitables:
        _discard(awaitable)


def _failure_text(cause: BaseException) -> str:
    """The JavaScript module's failure text: a code, or a clock/counter error's message (≤ 128)."""
    if isinstance(cause, LifecycleError):
        return cause.code
    message = cause.args[0] if cause.args and isinstance(cause.args[0], str) else ""
    return message[:MAX_FAILURE_CODE_POINTS] or "RUNTIME_DRAIN_FAILED"
