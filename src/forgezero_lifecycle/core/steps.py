"""The steps of one process's drain, as its :class:`~.drain.DrainController` drives them.

:class:`DrainSteps` implements :class:`~.drain.DrainDependencies` over the intake gate and the
registered participants, and builds the controller it serves. A drain request walks::

    asgi/middleware.py ─▶ asgi/control.py ─▶ DrainController.begin (core/drain.py)
        ─▶ DrainSteps (this module) ─▶ IntakeGate (core/gate.py) ─▶ asgi/middleware.py

The deadline is the controller's: it holds the request's ``timeoutMs`` and its begin, and the
steps read what is left of it (:meth:`DrainController.remaining`). Where the drain came from
(:attr:`DrainController.origin`) decides one thing: a drain request from the control plane
reaches only the process it landed on, so a process with sibling workers on its listening socket
(``uvicorn --workers N``, gunicorn) refuses it before anything changes, with a 409
``RUNTIME_DRAIN_SHARED_LISTENER`` saying how to drain every worker. A signal reaches every
worker: each drains itself. A ``serve --workers`` worker is drained with its whole generation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, final

from .._clock import Clock
from .._errors import DrainConflictError
from .._events import emit
from .._race import first
from .drain import DrainController, DrainOrigin
from .gate import IntakeGate
from .participant import WorkParticipant
from .siblings import sibling_pids

if TYPE_CHECKING:
    from ..wire.drain import WorkCounters

__all__ = ["DrainSteps"]

logger = logging.getLogger("forgezero_lifecycle.runtime")

SIBLINGS_ADVICE: Final = (
    "a drain request reaches only the worker it lands on, so nothing was changed; run the app "
    "with `forgezero-lifecycle serve APP --workers N`, which drains every worker as one "
    "generation, or drain with SIGTERM (under `uvicorn --workers N` or `gunicorn -k "
    "forgezero_lifecycle.gunicorn.UvicornWorker` every worker drains itself on its signal)"
)

#: Share of the drain deadline kept back so durable jobs are released before it expires.
_RELEASE_MARGIN_SHARE: Final = 0.1
_RELEASE_MARGIN_MAX: Final = 1.0


@final
class DrainSteps:
    """Close intake, wait for requests, stop jobs, resume: one process's drain, step by step."""

    def __init__(
        self,
        gate: IntakeGate,
        participants: Sequence[WorkParticipant],
        *,
        clock: Clock,
        revision: str | None,
        not_ready_grace: float,
        stream_grace: float,
        supervised: Callable[[], bool],
        siblings: Callable[[], tuple[int, ...]] = sibling_pids,
        detail: Callable[[], dict[str, Any] | None] | None = None,
    ) -> None:
        self._gate = gate
        # The runtime's list, read at each step: a participant added later takes part too.
        self._participants = participants
        self._clock = clock
        self._not_ready_grace = not_ready_grace
        self._stream_grace = stream_grace
        self._supervised = supervised
        self._find_siblings = siblings
        self._closed = asyncio.Event()
        self.controller = DrainController(
            self, revision=revision, clock=clock, admit=self._admit, detail=detail
        )

    def _admit(self, origin: DrainOrigin) -> None:
        """Refuse a control-plane drain of one worker among several, before anything changes."""
        if origin != "control" or self._supervised():
            return
        siblings = self._find_siblings()
        if not siblings:
            return
        logger.error(
            "drain.refused_partial: this process is one of %d worker processes accepting on the "
            "same listening socket (siblings: %s); %s",
            len(siblings) + 1,
            ", ".join(map(str, siblings)),
            SIBLINGS_ADVICE,
        )
        raise DrainConflictError(
            "RUNTIME_DRAIN_SHARED_LISTENER",
            detail=f"this worker shares its listening socket with {len(siblings)} other "
            f"worker process(es) (pids {', '.join(map(str, siblings))}); {SIBLINGS_ADVICE}",
        )

    # DrainDependencies, in the order the controller calls them.

    def drain_requests(self) -> None:
        self._gate.begin_draining()
        emit(logger, logging.INFO, "drain.readiness_off", not_ready_grace_s=self._not_ready_grace)
        if self._not_ready_grace <= 0:
            self._close_intake()

    async def wait_for_requests(self) -> None:
        if not self._closed.is_set():
            # Readiness has turned 503; intake closes after the grace (never past half the
            # deadline). This wait is part of the drain's work: a rollback cancels it.
            await self._clock.sleep(min(self._not_ready_grace, self.controller.timeout / 2))
            self._close_intake()
        notice_after = min(self._stream_grace, self.controller.remaining() / 2)
        if not (await first(self._gate.wait_idle(), self._clock.sleep(notice_after))).cancelled():
            return
        emit(logger, logging.INFO, "drain.stream_notice", elapsed_s=self._elapsed(), **self._open())
        self._gate.end_streams()
        cutoff_after = max(0.0, self.controller.remaining() - self._release_margin())
        if not (await first(self._gate.wait_idle(), self._clock.sleep(cutoff_after))).cancelled():
            return
        # The same margin as durable jobs: sends still blocked by clients that do not read are
        # given up now, so those connections are counted out before the deadline.
        emit(logger, logging.WARNING, "drain.cutoff", elapsed_s=self._elapsed(), **self._open())
        self._gate.cut_off()
        await self._gate.wait_idle()

    async def stop_jobs(self, timeout_ms: int) -> None:
        # timeout_ms is the controller's own deadline, which remaining() reads from it.
        await self._closed.wait()
        budget = max(0.0, self.controller.remaining() - self._release_margin())
        async with asyncio.TaskGroup() as group:
            for participant in self._participants:
                group.create_task(participant.finish(budget))

    def work_counters(self) -> WorkCounters:
        return self.in_flight()

    async def sleep(self, ms: int) -> None:
        await self._clock.sleep(ms / 1000)

    def resume(self) -> None:
        # The controller has cancelled the drain's work (and with it a grace still running).
        was_closed = self._closed.is_set()
        self._closed.clear()
        self._gate.reopen()
        if was_closed:
            for participant in self._participants:
                participant.resume_intake()

    # What the steps share with the runtime.

    def in_flight(self) -> WorkCounters:
        """Live in-flight counts per kind, as drain status reports them (its ``inFlight``)."""
        from ..wire.drain import WorkCounters

        gate = self._gate.statistics()
        per_kind = {"jobs": 0, "schedules": 0}
        for participant in self._participants:
            per_kind[participant.kind] += participant.in_flight()
        return WorkCounters(http=gate.http, websocket=gate.websocket, **per_kind)

    @property
    def intake_closed(self) -> bool:
        """True once the drain closed every kind of intake (and until a rollback reopens it)."""
        return self._closed.is_set()

    def _close_intake(self) -> None:
        # One synchronous step: nothing of any kind is admitted once this returns.
        self._gate.close()
        for participant in self._participants:
            participant.pause_intake()
        self._closed.set()
        emit(logger, logging.INFO, "drain.intake_closed", elapsed_s=self._elapsed())

    def _elapsed(self) -> float:
        return round(self.controller.elapsed(), 3)

    def notice_room(self) -> float:
        """Seconds from now until the cutoff: the stream notice's spread fits in half of it."""
        return self.controller.remaining() - self._release_margin()

    def _release_margin(self) -> float:
        return min(_RELEASE_MARGIN_MAX, self.controller.timeout * _RELEASE_MARGIN_SHARE)

    def _open(self) -> dict[str, int]:
        gate = self._gate.statistics()
        return {"http": gate.http, "websocket": gate.websocket}
