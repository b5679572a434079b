"""Named periodic jobs on an interval or a cron expression, with statistics for an incident.

``scheduler.add(name, fn, every=seconds)`` or ``cron="*/5 * * * *"`` (parsed by cronsim);
``start()`` / ``await stop()`` (or ``async with scheduler:``); ``pause()`` stops scheduling and
lets in-flight runs finish; ``resume()``; ``await run_now(name)``; ``statistics()``.

Rules:

* Interval ticks are fixed-rate on the injected :class:`~forgezero_lifecycle._clock.Clock`; a
  tick that fires late does not make the next ones late, and ticks missed while the loop was
  busy are skipped, never replayed. Cron ticks come from the injected ``now()`` (wall clock,
  evaluated in the time zone of the datetimes it returns; UTC by default).
* Missed ticks while paused are not replayed: :meth:`Scheduler.resume` computes each job's next
  tick from the resume time (``resume + every``, or the first cron time after ``now()``).
* A job never overlaps itself: a tick that finds the previous run still going is skipped and
  counted in ``skipped_overlaps``; ``run_now`` on a running job waits for that run instead.
* A drain pauses the scheduler's intake (:meth:`Scheduler.pause_intake`, the participant
  protocol's word): no tick fires and ``run_now`` raises :class:`ScheduleIntakePausedError` until
  :meth:`Scheduler.resume_intake`. This is separate from an operator's ``pause()``, which a
  rollback does not undo.
* An exception in a job never stops the scheduler: it is logged on the
  ``forgezero_lifecycle.scheduler`` logger and recorded in the job's statistics
  (``last_result="error"``, ``last_error``, ``consecutive_failures``, reset by the next success).
  A job's timer that fails (its clock or cron expression raising) is recorded the same way
  (``last_error`` starts with ``the schedule stopped:``; ``next_run_at`` is None) and logged as
  ``schedule.timer.failed``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import warnings
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Literal, Self, TypeVar, final

from .._clock import Clock, SystemClock
from .._errors import ScheduleIntakePausedError, ScheduleInvalidError, ScheduleNotFoundError
from .._race import wait_event
from ._schedule_statistics import ScheduledJobStatistics, SchedulerStatistics
from .participant import ParticipantKind

__all__ = ["ScheduledJobStatistics", "Scheduler", "SchedulerParticipant", "SchedulerStatistics"]

_log = logging.getLogger("forgezero_lifecycle.scheduler")
_ERROR_TEXT_LIMIT = 500

JobFunction = Callable[[], Awaitable[object]]
_F = TypeVar("_F", bound=JobFunction)


@final
class _Job:
    """The mutable record behind a :class:`ScheduledJobStatistics`."""

    __slots__ = (
        "consecutive_failures", "cron", "every", "failures", "fn", "last_duration",
        "last_error", "last_result", "last_run_at", "name", "next_cron", "next_due", "run",
        "runs", "skipped_overlaps", "timer",
    )  # fmt: skip

    def __init__(self, name: str, fn: JobFunction, every: float | None, cron: str | None) -> None:
        self.name, self.fn, self.every, self.cron = name, fn, every, cron
        self.runs = self.failures = self.consecutive_failures = self.skipped_overlaps = 0
        self.last_run_at: datetime | None = None
        self.last_duration: float | None = None
        self.last_result: Literal["ok", "error"] | None = None
        self.last_error: str | None = None
        self.next_due: float | None = None  # interval jobs: on the monotonic clock
        self.next_cron: datetime | None = None  # cron jobs: on the wall clock
        self.timer: asyncio.Task[None] | None = None
        self.run: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.run is not None and not self.run.done()


@final
class Scheduler:
    """Runs named async jobs on intervals or cron expressions; see the module docstring."""

    def __init__(
        self, *, clock: Clock | None = None, now: Callable[[], datetime] | None = None
    ) -> None:
        self._clock: Clock = SystemClock() if clock is None else clock
        self._now: Callable[[], datetime] = (lambda: datetime.now(UTC)) if now is None else now
        self._jobs: dict[str, _Job] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # hard references until done
        self._timers: set[asyncio.Task[None]] = set()
        self._started = False
        self._paused = False
        self._intake_paused = False
        self._idle = asyncio.Event()
        self._idle.set()

    def add(
        self, name: str, fn: JobFunction, *, every: float | None = None, cron: str | None = None
    ) -> None:
        """Register ``fn`` (an async callable without arguments) under a unique ``name``.

        Give exactly one of ``every`` (seconds, > 0) and ``cron`` (5 or 6 fields).
        Raises :class:`ScheduleInvalidError` for a bad name, a duplicate or a bad schedule.
        """
        if not isinstance(name, str) or not name:
            raise ScheduleInvalidError(
                detail=f"a job name must be a non-empty string, got {name!r}"
            )
        if name in self._jobs:
            raise ScheduleInvalidError(
                detail=f"job {name!r} is already scheduled; pick another name"
            )
        if not callable(fn):
            raise ScheduleInvalidError(detail=f"job {name!r} needs an async callable, got {fn!r}")
        if (every is None) == (cron is None):
            raise ScheduleInvalidError(detail=f"job {name!r} needs exactly one of every= and cron=")
        if every is not None and (
            isinstance(every, bool)
            or not isinstance(every, int | float)
            or not math.isfinite(every)
            or every <= 0
        ):
            raise ScheduleInvalidError(
                detail=f"job {name!r}: every= must be seconds > 0, got {every!r}"
            )
        if cron is not None:
            # cronsim (and the zoneinfo it loads) is imported only by a runtime that has cron jobs.
            from cronsim import CronSim, CronSimError

            try:
                CronSim(cron, self._now())
            except (CronSimError, AttributeError, TypeError) as exc:
                raise ScheduleInvalidError(
                    detail=f"job {name!r}: bad cron {cron!r} ({exc})"
                ) from None
        job = self._jobs[name] = _Job(name, fn, None if every is None else float(every), cron)
        self._arm(job)

    def job(
        self, name: str | None = None, *, every: float | None = None, cron: str | None = None
    ) -> Callable[[_F], _F]:
        """Decorator form of :meth:`add`; the name defaults to the function's ``__name__``."""

        def register(fn: _F) -> _F:
            self.add(fn.__name__ if name is None else name, fn, every=every, cron=cron)
            return fn

        return register

    def start(self) -> None:
        """Start ticking (needs a running event loop); a second call does nothing."""
        asyncio.get_running_loop()
        self._started = True
        for job in self._jobs.values():
            self._arm(job)

    async def stop(self, timeout: float | None = None) -> None:
        """Stop ticking and wait for running runs; after ``timeout`` seconds, cancel them."""
        self._started = False
        for job in self._jobs.values():
            self._disarm(job)
        runs = [job.run for job in self._jobs.values() if job.run is not None and job.running]
        if runs and (timeout is None or not await wait_event(self._idle, self._clock, timeout)):
            if timeout is not None:
                for run in runs:
                    run.cancel()
            await asyncio.wait(runs)
        if self._timers:
            await asyncio.wait(self._timers)

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def pause(self) -> None:
        """Stop scheduling ticks; runs already going finish. ``run_now`` still works."""
        self._paused = True
        for job in self._jobs.values():
            self._disarm(job)

    def resume(self) -> None:
        """Undo :meth:`pause`; each job's next tick is computed from now, nothing is replayed."""
        self._paused = False
        for job in self._jobs.values():
            self._arm(job)

    def pause_intake(self) -> None:
        """A drain's fence: no tick fires and ``run_now`` is refused; running runs finish."""
        self._intake_paused = True
        for job in self._jobs.values():
            self._disarm(job)

    def resume_intake(self) -> None:
        """Undo :meth:`pause_intake` (rollback); an operator's :meth:`pause` stays in force."""
        self._intake_paused = False
        for job in self._jobs.values():
            self._arm(job)

    async def run_now(self, name: str) -> ScheduledJobStatistics:
        """Run ``name`` now (or wait for its run in progress) and return its statistics after it."""
        job = self._job(name)
        if self._intake_paused:
            raise ScheduleIntakePausedError(
                detail="the runtime is draining; run it on the new generation"
            )
        run = job.run if job.run is not None and job.running else self._launch(job)
        await asyncio.wait((run,))
        return self._statistics_of(job)

    def statistics(self) -> SchedulerStatistics:
        """A frozen copy of the scheduler's flags and every job's statistics."""
        return SchedulerStatistics(
            started=self._started,
            paused=self._paused,
            intake_paused=self._intake_paused,
            running=self.in_flight(),
            jobs=tuple(self._statistics_of(job) for job in self._jobs.values()),
        )

    def job_statistics(self, name: str) -> ScheduledJobStatistics:
        """The statistics of one job; :class:`ScheduleNotFoundError` for an unknown name."""
        return self._statistics_of(self._job(name))

    def in_flight(self) -> int:
        """How many runs are going now."""
        return sum(1 for job in self._jobs.values() if job.running)

    async def wait_idle(self) -> None:
        """Return once no run is going (at once if none is)."""
        await self._idle.wait()

    def participant(self) -> SchedulerParticipant:
        """This scheduler as a drain :class:`~.participant.WorkParticipant` (``schedules``)."""
        return SchedulerParticipant(self)

    def _job(self, name: str) -> _Job:
        try:
            return self._jobs[name]
        except KeyError:
            raise ScheduleNotFoundError(detail=f"no job named {name!r} is scheduled") from None

    def _arm(self, job: _Job) -> None:
        if not self._started or self._paused or self._intake_paused or job.timer is not None:
            return
        if job.every is not None:
            job.next_due = self._clock.monotonic() + job.every
        else:
            job.next_cron = self._next_cron(job, self._now())
        job.timer = self._spawn(self._tick(job), f"forgezero-schedule-timer:{job.name}")
        self._timers.add(job.timer)
        job.timer.add_done_callback(self._timers.discard)
        job.timer.add_done_callback(lambda timer: self._timer_ended(job, timer))

    def _timer_ended(self, job: _Job, timer: asyncio.Task[None]) -> None:
        # A timer outlives every call that arms it, so its failure is kept in the job's status
        # (and logged) instead of leaving the schedule quiet; resume() or a rollback re-arms it.
        if timer.cancelled() or (error := timer.exception()) is None:
            return
        if job.timer is timer:
            job.timer, job.next_due, job.next_cron = None, None, None
        text = f"the schedule stopped: {type(error).__name__}: {error}"
        job.last_result, job.last_error = "error", text[:_ERROR_TEXT_LIMIT]
        _log.error("schedule.timer.failed name=%s error=%r", job.name, error)

    def _disarm(self, job: _Job) -> None:
        if job.timer is not None:
            job.timer.cancel()
        job.timer, job.next_due, job.next_cron = None, None, None

    def _next_cron(self, job: _Job, after: datetime) -> datetime:
        from cronsim import CronSim

        assert job.cron is not None
        return next(CronSim(job.cron, after))

    async def _tick(self, job: _Job) -> None:
        while True:
            if job.next_due is not None:
                await self._clock.sleep(job.next_due - self._clock.monotonic())
            elif job.next_cron is not None:
                await self._clock.sleep((job.next_cron - self._now()).total_seconds())
            self._fire(job)
            if job.every is not None and job.next_due is not None:
                late = max(0.0, self._clock.monotonic() - job.next_due)
                job.next_due += (math.floor(late / job.every) + 1) * job.every
            elif job.next_cron is not None:
                job.next_cron = self._next_cron(job, max(self._now(), job.next_cron))

    def _fire(self, job: _Job) -> None:
        if job.running:
            job.skipped_overlaps += 1
            _log.warning(
                "schedule.tick.skipped name=%s reason=overlap skipped_overlaps=%d",
                job.name,
                job.skipped_overlaps,
            )
            return
        self._launch(job)

    def _launch(self, job: _Job) -> asyncio.Task[None]:
        self._idle.clear()
        job.run = self._spawn(self._execute(job), f"forgezero-schedule-run:{job.name}")
        job.run.add_done_callback(self._run_done)
        return job.run

    def _spawn(self, coro: Coroutine[object, object, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _run_done(self, _: asyncio.Task[None]) -> None:
        if self.in_flight() == 0:
            self._idle.set()

    async def _execute(self, job: _Job) -> None:
        job.runs += 1
        job.last_run_at = self._now()
        started = self._clock.monotonic()
        try:
            await job.fn()
        except asyncio.CancelledError:
            self._record_failure(job, started, "CancelledError: the run was cancelled")
            raise
        except Exception as exc:
            self._record_failure(job, started, f"{type(exc).__name__}: {exc}")
            _log.exception(
                "schedule.run.failed name=%s consecutive_failures=%d",
                job.name,
                job.consecutive_failures,
            )
        else:
            job.last_duration = self._clock.monotonic() - started
            job.last_result, job.last_error, job.consecutive_failures = "ok", None, 0

    def _record_failure(self, job: _Job, started: float, error: str) -> None:
        job.last_duration = self._clock.monotonic() - started
        job.last_result, job.last_error = "error", error[:_ERROR_TEXT_LIMIT]
        job.failures += 1
        job.consecutive_failures += 1

    def _statistics_of(self, job: _Job) -> ScheduledJobStatistics:
        next_run_at = job.next_cron
        if job.next_due is not None:
            next_run_at = self._now() + timedelta(seconds=job.next_due - self._clock.monotonic())
        return ScheduledJobStatistics(
            name=job.name,
            every=job.every,
            cron=job.cron,
            running=job.running,
            runs=job.runs,
            failures=job.failures,
            last_run_at=job.last_run_at,
            last_duration=job.last_duration,
            last_result=job.last_result,
            last_error=job.last_error,
            consecutive_failures=job.consecutive_failures,
            skipped_overlaps=job.skipped_overlaps,
            next_run_at=next_run_at,
        )


@final
class SchedulerParticipant:
    """A :class:`Scheduler` seen by the drain: kind ``schedules``, in flight = running runs."""

    __slots__ = ("_scheduler",)

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    @property
    def kind(self) -> ParticipantKind:
        return "schedules"

    @property
    def scheduler(self) -> Scheduler:
        return self._scheduler

    def in_flight(self) -> int:
        return self._scheduler.in_flight()

    def pause_intake(self) -> None:
        self._scheduler.pause_intake()

    async def finish(self, timeout: float) -> None:
        """Wait for running runs to end; they are never cancelled here.

        A run cannot be handed to the next generation, so this waits past ``timeout`` and lets
        the drain's own deadline decide (failed, with the run counted under ``schedules``).
        """
        await self._scheduler.wait_idle()

    async def drain(self, timeout: float) -> None:
        """Deprecated name of :meth:`finish`."""
        warnings.warn(
            "SchedulerParticipant.drain(timeout) is deprecated: call finish(timeout)",
            DeprecationWarning,
            stacklevel=2,
        )
        await self.finish(timeout)

    def resume_intake(self) -> None:
        self._scheduler.resume_intake()
