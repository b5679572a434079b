"""The composition root: one :class:`Runtime` per process builds and wires every part.

::

    runtime = Runtime(control_token=os.environ["FORGEZERO_CONTROL_TOKEN"], revision=REVISION)
    runtime.install(app)            # Starlette / FastAPI: middleware + control plane
    app = runtime.wrap(any_asgi)    # any other ASGI app

A drain with ``timeoutMs = T`` runs, all inside T (README, "What a drain does"):

1. readiness turns 503 and :attr:`Runtime.draining` is set;
2. for ``not_ready_grace`` seconds intake stays open, so load balancers see readiness first;
3. the gate and every registered participant (queue, job worker, scheduler) close in one step;
4. admitted work runs on, responses carry ``Connection: close``;
5. after ``stream_grace`` (at most half of what is left of T) WebSockets get close 1012 and
   streaming responses get ``http.disconnect``, each at its own instant, evenly over
   ``stream_notice_spread`` seconds (at most half of what is left until step 6's margin);
6. participants drain; durable jobs still running near the deadline are released, fenced; at
   the same release margin the gate's cutoff gives up on sends still blocked by clients that do
   not read, so their connections are abandoned and counted out before T;
7. drained when every counter is 0, failed otherwise. Rollback reopens everything.

Background work the app starts with :meth:`Runtime.create_task` or :meth:`Runtime.hold` is a
participant too (counted under ``jobs``). Where the runtime owns the stop (``serve``, the signal
hook), the app's lifespan shutdown follows the drain, within what is left of its deadline plus
``teardown_margin`` (:meth:`Runtime.teardown`), and the server's stop comes last.

The steps are :class:`~forgezero_lifecycle.core.steps.DrainSteps`'s, driven by its
:class:`~forgezero_lifecycle.core.drain.DrainController` (:attr:`Runtime.drain`); the runtime only
builds and wires them.

Under a server the user runs (``uvicorn myapp:app``, hypercorn, gunicorn with the uvicorn worker)
the first SIGTERM or SIGINT begins such a drain itself, with a deadline of
``signal_drain_timeout`` seconds, and the server's own stop follows once it settled
(:mod:`forgezero_lifecycle.core.signal_drain`; ``drain_on_signal=False`` turns that off).

The library reads no environment variables; the CLI maps them to these arguments.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Final, TypeVar, final

from starlette.applications import Starlette

from ._clock import Clock, SystemClock
from ._errors import ConfigurationError
from ._tokens import check_token_pair
from .asgi._in_flight import MAX_ITEMS, InFlightItem
from .asgi._teardown import Teardown
from .asgi._types import ASGIApp, Scope
from .asgi.control import ControlApp
from .asgi.middleware import InFlightMiddleware
from .asgi.published import Document, PublishedDocuments
from .core.background import BackgroundStatistics, BackgroundWork
from .core.gate import IntakeGate
from .core.participant import WorkParticipant, as_participant
from .core.signal_drain import SignalDrain
from .core.steps import DrainSteps
from .wire import paths
from .wire._protocol import (
    MAX_DRAIN_TIMEOUT_MS,
    MIN_DRAIN_TIMEOUT_MS,
    deadline_problem,
    is_revision,
)

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider
    from prometheus_client import CollectorRegistry

    # pydantic, imported where used: the handoff with a state adapter, the wire models on the
    # first drain request (a runtime that is never drained does not load it).
    from .core.handoff import StateAdapter, StateHandoffController
    from .wire.drain import WorkCounters

__all__ = ["Runtime"]

P = TypeVar("P", bound=WorkParticipant)
T = TypeVar("T")

#: Close codes an endpoint may send (RFC 6455 §7.4: 1004-1006, 1015 and 1016-2999 may not be).
_SENDABLE_CLOSE_CODES: Final = frozenset(
    (1000, 1001, 1002, 1003, *range(1007, 1015), *range(3000, 5000))
)


@final
class Runtime:
    """One generation's lifecycle: intake gate, drain, state handoff and control plane."""

    def __init__(
        self,
        *,
        control_token: str | None = None,
        handoff_token: str | None = None,
        revision: str | None = None,
        state_adapter: StateAdapter[Any] | None = None,
        not_ready_grace: float = 0.0,
        stream_grace: float = 5.0,
        stream_notice_spread: float = 2.0,
        websocket_close_code: int = 1012,
        retry_after: int = 1,
        exempt: Callable[[Scope], bool] | None = None,
        insecure_loopback_control: bool = False,
        drain_on_signal: bool = True,
        signal_drain_timeout: float = 30.0,
        clock: Clock | None = None,
        openapi: bool = False,
        metrics: CollectorRegistry | None = None,
        handoff_pauses_collector: bool = False,
        teardown_margin: float = 2.0,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        """Build a generation's runtime; a setting that could never work raises here.

        Args:
            control_token: The control plane's bearer token (at least 16 RFC 6750 bearer
                characters); required unless `insecure_loopback_control` is true.
            handoff_token: The token of `GET state/v1/export`: exactly 43 base64url
                characters, different from the control token; None serves no export.
            revision: The full 40-hex commit this code was built from; a drain (or an export)
                for another `sourceRevision` is refused with 409.
            state_adapter: A `StateAdapter`: enables the `state/v1` endpoints.
            not_ready_grace: Seconds readiness is off before intake closes.
            stream_grace: Seconds before open WebSockets and streams are ended.
            stream_notice_spread: Seconds over which that notice is spread, so clients do not
                all reconnect in the same instant (0 to 3,600).
            websocket_close_code: The close code of that notice (1012, "service restart");
                1005, 1006, 1015 and reserved codes are refused.
            retry_after: The `Retry-After` seconds of a refused request's 503.
            exempt: `scope -> bool`: paths neither counted nor refused (e.g. `/metrics`).
            insecure_loopback_control: Development only: no token, loopback clients only.
            drain_on_signal: Under uvicorn, hypercorn or gunicorn, SIGTERM and SIGINT drain
                first, then the server stops.
            signal_drain_timeout: That drain's deadline, 0.1 to 600 seconds.
            clock: The monotonic clock (tests pass a manual one).
            openapi: Serve `GET /.forgezero/runtime/openapi.json`, without a token.
            metrics: A `prometheus_client` registry: serve it at
                `GET /.forgezero/runtime/metrics`, without a token.
            handoff_pauses_collector: Pause the garbage collector while a handoff's state is
                imported ([The garbage collector](handoff-collector.md)).
            teardown_margin: Seconds the app's lifespan shutdown may take beyond what is left
                of the drain's deadline, where the runtime owns the stop (0 to 600;
                [Long-lived work](long-lived-work.md)).
            tracer_provider: Where each drain's `forgezero.drain` span goes; None: the global
                one. Needs the `[otel]` extra ([OpenTelemetry](metrics.md#opentelemetry)).
            meter_provider: Where the runtime's metrics go; None: the global one (`[otel]`).

        Raises:
            ConfigurationError: A setting that could never work (a short revision, a handoff
                token the wire cannot carry, an example's placeholder token...), naming the fix.
        """
        if control_token is None and not insecure_loopback_control:
            raise ConfigurationError(
                detail="a control token is required (or insecure_loopback_control=True for "
                "local development, which admits loopback clients only)"
            )
        check_token_pair(control_token, handoff_token)
        _check_settings(revision, websocket_close_code, retry_after)
        if not_ready_grace < 0 or stream_grace < 0:
            raise ConfigurationError(detail="grace periods must be ≥ 0 seconds")
        _check_signal_options(drain_on_signal, signal_drain_timeout)
        if not isinstance(handoff_pauses_collector, bool):
            raise ConfigurationError(detail="handoff_pauses_collector must be True or False")
        _check_notice_spread(stream_notice_spread)
        _check_teardown_margin(teardown_margin)
        self.revision = revision
        self.gate = IntakeGate()
        self._clock = clock or SystemClock()
        self._not_ready_grace = not_ready_grace
        self._stream_grace = stream_grace
        self._notice_spread = float(stream_notice_spread)
        self._close_code = websocket_close_code
        self._retry_after = retry_after
        self._exempt = exempt
        self._background = BackgroundWork(self._clock)
        self._participants: list[WorkParticipant] = [self._background]
        self._teardown_margin = float(teardown_margin)
        self._teardown = Teardown(self._clock, self._teardown_bound)
        #: The middleware of every app this runtime wrapped, for what blocks a drain.
        self._middlewares: list[InFlightMiddleware] = []
        #: True when a ``serve --workers`` supervisor drains this process together with the other
        #: workers on its listening socket; otherwise a drain checks for such siblings itself.
        self.supervised = False
        self._steps = DrainSteps(
            self.gate,
            self._participants,
            clock=self._clock,
            revision=revision,
            not_ready_grace=not_ready_grace,
            stream_grace=stream_grace,
            supervised=lambda: self.supervised,
            detail=self._status_detail,
        )
        self.drain = self._steps.controller
        #: The hook that turns SIGTERM/SIGINT under the user's server into a self-drain.
        self.signal_drain = SignalDrain(
            self.drain,
            revision=revision,
            timeout=signal_drain_timeout,
            enabled=drain_on_signal,
            before_stop=self.teardown,
        )
        self.handoff: StateHandoffController[Any] | None = None
        if state_adapter is not None:
            from .core.handoff import StateHandoffController

            # Without a handoff token no generation configured like this one serves an export
            # (and `serve` refuses the handover), so httpx is loaded only if a begin comes.
            self.handoff = StateHandoffController(
                state_adapter,
                clock=self._clock,
                revision=revision,
                prepare_fetch=handoff_token is not None,
                pause_collector=handoff_pauses_collector,
            )
        self.control = ControlApp(
            drain=self.drain,
            handoff=self.handoff,
            is_ready=lambda: not self.gate.draining,
            intake_closed=lambda: not self.gate.is_open,
            control_token=control_token,
            handoff_token=handoff_token,
            schedules=self.scheduled_jobs,
            loopback_only=insecure_loopback_control,
        )
        self._published: dict[str, Document] = {}
        if openapi:
            self._published[paths.RUNTIME_OPENAPI_PATH] = _openapi_document
        if metrics is not None:
            self._published[paths.RUNTIME_METRICS_PATH] = _metrics_endpoint(self, metrics)
        self._telemetry = _telemetry(self, self._clock, tracer_provider, meter_provider)

    @property
    def draining(self) -> asyncio.Event:
        """Set from the instant a drain begins until it is rolled back.

        The gate holds the fact (:attr:`IntakeGate.draining_event`, set with its ``draining``
        flag), so readiness, ``Connection: close`` and this event never disagree.
        """
        return self.gate.draining_event

    @property
    def not_ready_grace(self) -> float:
        """Seconds a drain keeps admitting after readiness turned 503."""
        return self._not_ready_grace

    @property
    def stream_grace(self) -> float:
        """Seconds after intake closed until WebSockets and streams get the drain notice."""
        return self._stream_grace

    def published_document(self, path: str) -> Document | None:
        """The opt-in document served at ``path`` (OpenAPI, metrics), or None when not served."""
        return self._published.get(path)

    def add(self, participant: P) -> P:
        """Register memory or durable work (queue, job worker, scheduler) with the drain."""
        adapted = as_participant(participant)
        if adapted is None:
            raise ConfigurationError(detail=f"{participant!r} is not a WorkParticipant")
        self._participants.append(adapted)
        if not self.gate.is_open:
            adapted.pause_intake()
        return participant

    @property
    def participants(self) -> Sequence[WorkParticipant]:
        """The registered participants (queue, job workers, schedulers), in order added."""
        return tuple(self._participants[1:])  # the first is the runtime's own background work

    def create_task(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        """Start background work the drain waits for, counted under ``jobs``.

        Admitted while intake is open; once the drain closed it, raises
        :class:`~forgezero_lifecycle.DrainingError` (and ``coro`` is closed, never run). The
        drain waits for the task within its deadline; at its release margin (the cutoff) a task
        still running is cancelled and logged by ``name`` (``background.cancelled``). A task that
        fails is logged by name (``background.failed``). The runtime keeps every task until it
        is done: no reference of the caller's is needed.
        """
        return self._background.create_task(coro, name=name)

    def hold(self, name: str) -> AbstractAsyncContextManager[None]:
        """``async with runtime.hold(name):`` counts the block as background work, as
        :meth:`create_task` does a task: refused with
        :class:`~forgezero_lifecycle.DrainingError` once intake closed, waited for by the
        drain, and its task cancelled at the cutoff if still inside."""
        return self._background.hold(name)

    def background(self) -> BackgroundStatistics:
        """A snapshot of the background work: names running, completed, failed, cancelled."""
        return self._background.statistics()

    async def teardown(self) -> bool:
        """The app's lifespan shutdown, once the drain settled, within what is left of the
        drain's deadline plus ``teardown_margin``; False when it failed or overran (logged).

        ``serve`` and the signal hook call it before the server's stop; the server's own
        ``lifespan.shutdown`` is then answered with the app's answer. Nothing to run (no
        lifespan, or one already shut down) is True.
        """
        return await self._teardown.shut_down()

    @property
    def teardown_failed(self) -> bool:
        """The app's lifespan shutdown failed or overran its bound (the stop exits 1)."""
        return self._teardown.failed

    def _teardown_bound(self) -> float:
        return self.drain.remaining() + self._teardown_margin

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """Wrap any ASGI app: in-flight middleware outside, control plane ahead of its routes."""
        return self._middleware(app)

    def _middleware(self, app: ASGIApp) -> InFlightMiddleware:
        middleware = InFlightMiddleware(app, **self._middleware_options())
        middleware.forgezero_runtime = self
        self._middlewares.append(middleware)
        return middleware

    def install(self, app: Starlette) -> None:
        """Install on a Starlette or FastAPI app, outside all of its middleware.

        The app's ``build_middleware_stack`` is wrapped, so the in-flight middleware and the
        control plane stay outermost even for middleware added after this call
        (``add_middleware``, ``@app.middleware("http")``), and Starlette's own error middleware
        runs inside the counted region too. Install once, before the app serves.
        """
        if getattr(app.state, "forgezero_runtime", None) is not None:
            raise ConfigurationError(
                detail="a runtime is already installed on this app; install one runtime, once"
            )
        if app.middleware_stack is not None:
            raise ConfigurationError(
                detail="the app has already started serving; call install() before it starts"
            )
        build = app.build_middleware_stack

        def build_inside_runtime() -> ASGIApp:
            # Starlette calls its stack on every request: a bound method is called the way a
            # function is, without the lookup of ``__call__`` an instance needs each time.
            return self._middleware(build()).__call__

        # An instance attribute shadows the class's method: Starlette and FastAPI both build
        # their stack through self.build_middleware_stack() on the first call.
        app.build_middleware_stack = build_inside_runtime  # type: ignore[method-assign]
        app.state.forgezero_runtime = self

    def _middleware_options(self) -> dict[str, Any]:
        control: ASGIApp = self.control
        if self._published:
            control = PublishedDocuments(control, self._published)
        return {
            "gate": self.gate,
            "control": control,
            "exempt": self._exempt,
            "websocket_close_code": self._close_code,
            "retry_after": self._retry_after,
            "signals": self.signal_drain if self.signal_drain.pending else None,
            "notice_spread": self._notice_spread,
            "notice_room": self._steps.notice_room,
            "teardown": self._teardown,
        }

    async def aclose(self) -> None:
        """Release what the runtime owns: a handoff fetch still running is cancelled (failed)."""
        if self.handoff is not None:
            await self.handoff.aclose()

    def in_flight(self) -> WorkCounters:
        """Live in-flight counts per kind, as drain status reports them (its ``inFlight``).

        The same word as each participant's ``in_flight()``: the counts a drain waits for.
        """
        return self._steps.in_flight()

    def oldest_in_flight(self, limit: int = MAX_ITEMS) -> list[InFlightItem]:
        """The ``limit`` oldest HTTP requests and WebSocket sessions running now, oldest
        first: kind, method, route template (never the raw path) and age in milliseconds.

        A drain's status names them in ``detail.oldestInFlight`` (at most five), so an operator
        sees what a slow drain waits for.
        """
        items: list[InFlightItem] = []
        for middleware in self._middlewares:
            items.extend(middleware.oldest_in_flight(limit))
        items.sort(key=_oldest_first)
        return items[:limit]

    def _status_detail(self) -> dict[str, Any] | None:
        items = self.oldest_in_flight()
        return {"oldestInFlight": items} if items else None

    def scheduled_jobs(self) -> list[object]:
        """Every added scheduler's jobs, as ``schedules/v1/status`` lists them."""
        from .core.scheduler import SchedulerParticipant  # loaded by whoever built a scheduler

        result: list[object] = []
        for participant in self._participants:
            if isinstance(participant, SchedulerParticipant):
                result.extend(job.to_dict() for job in participant.scheduler.statistics().jobs)
        return result


def _oldest_first(item: InFlightItem) -> float:
    age = item["ageMs"]
    return 1.0 if age is None else -age  # an unknown age after every known one


def _telemetry(
    runtime: Runtime,
    clock: Clock,
    tracer_provider: TracerProvider | None,
    meter_provider: MeterProvider | None,
) -> object | None:
    """The runtime's spans and metrics when ``opentelemetry-api`` is installed (``[otel]``);
    without it, nothing (and a provider passed anyway is a configuration error)."""
    try:
        from .otel import RuntimeTelemetry
    except ImportError as error:
        if not (error.name or "").startswith("opentelemetry"):
            raise
        if tracer_provider is not None or meter_provider is not None:
            raise ConfigurationError(
                detail="tracer_provider= and meter_provider= need OpenTelemetry's API: "
                "pip install 'forgezero-lifecycle[otel]'"
            ) from None
        return None
    return RuntimeTelemetry(
        runtime, clock=clock, tracer_provider=tracer_provider, meter_provider=meter_provider
    )


def _metrics_endpoint(runtime: Runtime, registry: CollectorRegistry) -> Document:
    """Register the runtime's collector in ``registry``; serve the registry (``[metrics]``)."""
    try:
        from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

        from .metrics import RuntimeCollector
    except ImportError:
        raise ConfigurationError(
            detail="metrics= needs prometheus_client: pip install 'forgezero-lifecycle[metrics]'"
        ) from None
    registry.register(RuntimeCollector(runtime))
    return lambda: (generate_latest(registry), CONTENT_TYPE_LATEST)


def _openapi_document() -> tuple[bytes, str]:
    from .wire.openapi import document_bytes

    return document_bytes(), "application/json"


def _check_settings(revision: str | None, close_code: int, retry_after: int) -> None:
    """The settings a drain could never work with are refused when the runtime is built."""
    if revision is not None and not is_revision(revision):
        raise ConfigurationError(
            detail=f"revision must be the full 40-hex commit (git rev-parse HEAD), got "
            f"{revision!r:.60}: drains name it as sourceRevision, and a short one never matches"
        )
    if isinstance(close_code, bool) or close_code not in _SENDABLE_CLOSE_CODES:
        raise ConfigurationError(
            detail=f"websocket_close_code {close_code!r} may not be sent (RFC 6455 §7.4); use "
            "1012 (service restart), 1001 (going away) or an application code 3000-4999"
        )
    if isinstance(retry_after, bool) or not isinstance(retry_after, int) or retry_after < 0:
        raise ConfigurationError(
            detail=f"retry_after must be whole seconds ≥ 0 (the Retry-After header), got "
            f"{retry_after!r}"
        )


def _check_notice_spread(spread: object) -> None:
    high = MAX_DRAIN_TIMEOUT_MS / 1000
    if (
        isinstance(spread, bool)
        or not isinstance(spread, int | float)
        or not 0 <= spread <= high  # NaN fails this too
    ):
        raise ConfigurationError(
            detail=f"stream_notice_spread must be 0 to {high:g} seconds (0: every WebSocket and "
            f"stream is told at once), not {spread!r}"
        )


def _check_teardown_margin(margin: object) -> None:
    high = MAX_DRAIN_TIMEOUT_MS / 1000
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not 0 <= margin <= high:
        raise ConfigurationError(
            detail=f"teardown_margin must be 0 to {high:g} seconds (what the app's lifespan "
            f"shutdown may take beyond the drain's deadline), not {margin!r}"
        )


def _check_signal_options(drain_on_signal: object, timeout: object) -> None:
    if not isinstance(drain_on_signal, bool):
        raise ConfigurationError(
            detail=f"drain_on_signal must be True or False, not {drain_on_signal!r}"
        )
    low, high = MIN_DRAIN_TIMEOUT_MS / 1000, MAX_DRAIN_TIMEOUT_MS / 1000
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or deadline_problem(round(timeout * 1000)) is not None
    ):
        raise ConfigurationError(
            detail=f"signal_drain_timeout must be {low:g} to {high:g} seconds, not {timeout!r}"
        )
