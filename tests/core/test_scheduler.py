"""Scheduler: ticks on a manual clock, pause/resume, run_now, incident status, cron, participant."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import pytest

from forgezero_lifecycle._errors import (
    ScheduleIntakePausedError,
    ScheduleInvalidError,
    ScheduleNotFoundError,
)
from forgezero_lifecycle.core.participant import WorkParticipant
from forgezero_lifecycle.core.scheduler import Scheduler
from forgezero_lifecycle.testing import ManualClock, settle

BASE = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def wall(clock: ManualClock, start: datetime = BASE) -> Callable[[], datetime]:
    """A wall clock that moves with the manual clock."""
    return lambda: start + timedelta(seconds=clock.monotonic())


class Counter:
    """A job that counts its runs and can be told to fail or to block."""

    def __init__(self) -> None:
        self.runs = 0
        self.fail = False
        self.gate: asyncio.Event | None = None

    async def __call__(self) -> None:
        self.runs += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise RuntimeError(f"run {self.runs} failed")


def make(clock: ManualClock, start: datetime = BASE) -> Scheduler:
    return Scheduler(clock=clock, now=wall(clock, start))


@pytest.fixture
async def scheduler(clock: ManualClock) -> AsyncIterator[Scheduler]:
    """A scheduler on the manual clock, stopped after the test whatever happened."""
    made = make(clock)
    try:
        yield made
    finally:
        await made.stop()


@pytest.mark.anyio
async def test_interval_runs_each_period(clock: ManualClock, scheduler: Scheduler) -> None:
    """An `every=10` job runs at 10, 20, 30 s after start and reports its next run."""
    job = Counter()
    scheduler.add("tick", job, every=10)
    async with scheduler:
        await clock.advance(9.9)
        assert job.runs == 0
        assert scheduler.job_statistics("tick").next_run_at == BASE + timedelta(seconds=10)
        await clock.advance(0.1)
        assert job.runs == 1
        await clock.advance(20)
        assert job.runs == 3
        status = scheduler.job_statistics("tick")
        assert status.runs == 3
        assert status.last_result == "ok"
        assert status.last_run_at == BASE + timedelta(seconds=30)
        assert status.last_duration == 0.0
        assert status.next_run_at == BASE + timedelta(seconds=40)
    assert not scheduler.statistics().started
    assert scheduler.job_statistics("tick").next_run_at is None


@pytest.mark.anyio
async def test_pause_stops_ticks(clock: ManualClock, scheduler: Scheduler) -> None:
    """After pause no tick starts a run; the run already going completes normally."""
    job = Counter()
    job.gate = asyncio.Event()
    scheduler.add("slow", job, every=10)
    scheduler.start()
    await clock.advance(10)
    assert scheduler.in_flight() == 1
    scheduler.pause()
    assert scheduler.statistics().paused
    assert scheduler.job_statistics("slow").next_run_at is None
    job.gate.set()
    await settle()
    assert scheduler.in_flight() == 0
    assert scheduler.job_statistics("slow").last_result == "ok"
    await clock.advance(100)
    assert job.runs == 1


@pytest.mark.anyio
async def test_missed_ticks_not_replayed(clock: ManualClock, scheduler: Scheduler) -> None:
    """Resume computes the next tick from the resume time: no burst of missed runs."""
    job = Counter()
    scheduler.add("tick", job, every=10)
    scheduler.start()
    await clock.advance(5)
    scheduler.pause()
    await clock.advance(100)  # ten ticks would have fallen due
    scheduler.resume()
    assert scheduler.job_statistics("tick").next_run_at == BASE + timedelta(seconds=115)
    await settle()
    assert job.runs == 0
    await clock.advance(9.9)
    assert job.runs == 0
    await clock.advance(0.1)
    assert job.runs == 1


@pytest.mark.anyio
async def test_run_now_runs_at_once(
    clock: ManualClock,
    scheduler: Scheduler,
) -> None:
    """`run_now` runs the job immediately, whether started, paused or neither."""
    job = Counter()
    scheduler.add("rotate", job, every=3600)
    status = await scheduler.run_now("rotate")
    assert (job.runs, status.runs, status.last_result) == (1, 1, "ok")
    scheduler.start()
    scheduler.pause()
    status = await scheduler.run_now("rotate")
    assert (job.runs, status.runs) == (2, 2)
    assert status.next_run_at is None


@pytest.mark.anyio
async def test_run_now_joins_running(
    clock: ManualClock,
    scheduler: Scheduler,
) -> None:
    """A job never runs twice at once: run_now joins the run in progress."""
    job = Counter()
    job.gate = asyncio.Event()
    scheduler.add("slow", job, every=60)
    first = asyncio.create_task(scheduler.run_now("slow"))
    await settle()
    second = asyncio.create_task(scheduler.run_now("slow"))
    await settle()
    assert scheduler.in_flight() == 1
    job.gate.set()
    assert (await first).runs == 1
    assert (await second).runs == 1
    assert job.runs == 1


@pytest.mark.anyio
async def test_failures_counted_then_reset(
    clock: ManualClock, scheduler: Scheduler, caplog: pytest.LogCaptureFixture
) -> None:
    """Each failure raises the count and keeps the error text; one success resets it."""
    job = Counter()
    job.fail = True
    scheduler.add("flaky", job, every=10)
    scheduler.start()
    with caplog.at_level(logging.ERROR, logger="forgezero_lifecycle.scheduler"):
        await clock.advance(30)
    status = scheduler.job_statistics("flaky")
    assert (status.runs, status.failures, status.consecutive_failures) == (3, 3, 3)
    assert status.last_result == "error"
    assert status.last_error == "RuntimeError: run 3 failed"
    records = [r for r in caplog.records if r.name == "forgezero_lifecycle.scheduler"]
    assert len(records) == 3
    assert records[-1].msg == "schedule.run.failed name=%s consecutive_failures=%d"
    assert records[-1].args == ("flaky", 3)
    assert records[-1].exc_info is not None
    job.fail = False
    await clock.advance(10)
    status = scheduler.job_statistics("flaky")
    assert (status.runs, status.failures, status.consecutive_failures) == (4, 3, 0)
    assert (status.last_result, status.last_error) == ("ok", None)


@pytest.mark.anyio
async def test_job_error_keeps_scheduler(clock: ManualClock, scheduler: Scheduler) -> None:
    """A job that raises keeps its schedule, and other jobs are untouched."""
    broken, healthy = Counter(), Counter()
    broken.fail = True
    scheduler.add("broken", broken, every=5)
    scheduler.add("healthy", healthy, every=5)
    async with scheduler:
        await clock.advance(50)
    assert (broken.runs, healthy.runs) == (10, 10)
    assert scheduler.job_statistics("healthy").consecutive_failures == 0


@pytest.mark.anyio
async def test_overlapping_tick_skipped(
    clock: ManualClock,
    scheduler: Scheduler,
) -> None:
    """Overlapping runs are not started; each skipped tick shows in skipped_overlaps."""
    job = Counter()
    job.gate = asyncio.Event()
    scheduler.add("slow", job, every=10)
    scheduler.start()
    await clock.advance(35)  # runs at 10, still going at 20 and 30
    status = scheduler.job_statistics("slow")
    assert (job.runs, status.skipped_overlaps, status.running) == (1, 2, True)
    job.gate.set()
    await settle()
    job.gate = None
    await clock.advance(5)  # tick at 40 finds it finished
    status = scheduler.job_statistics("slow")
    assert (job.runs, status.runs, status.skipped_overlaps, status.running) == (2, 2, 2, False)
    assert status.last_duration == 0.0


@pytest.mark.anyio
async def test_cron_next_run_from_now(clock: ManualClock) -> None:
    """`*/5 * * * *` at 00:01:30 next runs at 00:05:00, then every five minutes."""
    start = datetime(2030, 1, 1, 0, 1, 30, tzinfo=UTC)
    scheduler = make(clock, start)
    job = Counter()
    scheduler.add("report", job, cron="*/5 * * * *")
    scheduler.start()
    status = scheduler.job_statistics("report")
    assert (status.cron, status.every) == ("*/5 * * * *", None)
    assert status.next_run_at == datetime(2030, 1, 1, 0, 5, tzinfo=UTC)
    await clock.advance(209.9)
    assert job.runs == 0
    await clock.advance(0.1)
    assert job.runs == 1
    assert scheduler.job_statistics("report").last_run_at == datetime(2030, 1, 1, 0, 5, tzinfo=UTC)
    assert scheduler.job_statistics("report").next_run_at == datetime(2030, 1, 1, 0, 10, tzinfo=UTC)
    await clock.advance(600)
    assert job.runs == 3
    await scheduler.stop()


@pytest.mark.anyio
async def test_cron_missed_not_replayed(clock: ManualClock, scheduler: Scheduler) -> None:
    """A cron job resumed after an hour runs at its next slot, not once per missed slot."""
    job = Counter()
    scheduler.add("report", job, cron="*/5 * * * *")
    scheduler.start()
    scheduler.pause()
    await clock.advance(3600 + 60)
    scheduler.resume()
    await settle()
    assert job.runs == 0
    assert scheduler.job_statistics("report").next_run_at == BASE + timedelta(hours=1, minutes=5)
    await clock.advance(240)
    assert job.runs == 1


@pytest.mark.anyio
async def test_cron_fixed_now_advances(clock: ManualClock) -> None:
    """Each cron tick is computed after the one just fired, even if now() has not moved."""
    scheduler = Scheduler(clock=clock, now=lambda: BASE)
    job = Counter()
    scheduler.add("minutely", job, cron="* * * * *")
    scheduler.start()
    await clock.advance(60)
    assert job.runs == 1
    assert scheduler.job_statistics("minutely").next_run_at == BASE + timedelta(minutes=2)
    await scheduler.stop()


@pytest.mark.parametrize(
    ("name", "schedule"),
    [
        ("", {"every": 1}),
        ("j", {}),
        ("j", {"every": 1, "cron": "* * * * *"}),
        ("j", {"every": 0}),
        ("j", {"every": -5}),
        ("j", {"every": float("nan")}),
        ("j", {"every": float("inf")}),
        ("j", {"every": True}),
        ("j", {"every": "10"}),
        ("j", {"cron": "not a cron"}),
        ("j", {"cron": "61 * * * *"}),
        ("j", {"cron": "* * * *"}),
        ("j", {"cron": 5}),
    ],
)
def test_bad_schedule_invalid(name: str, schedule: dict[str, object]) -> None:
    """Names must be non-empty and exactly one valid schedule must be given."""
    with pytest.raises(ScheduleInvalidError) as refused:
        Scheduler().add(
            name, Counter(), **schedule
        )  # deliberately the wrong type: the test is about refusing it
    assert refused.value.code == "SCHEDULE_INVALID"


def test_duplicate_or_uncallable() -> None:
    """Job names are unique, and the job must be callable."""
    scheduler = Scheduler()
    scheduler.add("j", Counter(), every=1)
    with pytest.raises(ScheduleInvalidError, match="already scheduled"):
        scheduler.add("j", Counter(), every=1)
    with pytest.raises(ScheduleInvalidError, match="async callable"):
        scheduler.add(
            "k", "not callable", every=1
        )  # deliberately the wrong type: the test is about refusing it


@pytest.mark.anyio
async def test_unknown_job_not_found() -> None:
    """run_now and job_statistics name the missing job."""
    scheduler = Scheduler()
    with pytest.raises(ScheduleNotFoundError, match="'nope'") as missing:
        await scheduler.run_now("nope")
    assert missing.value.code == "SCHEDULE_NOT_FOUND"
    with pytest.raises(ScheduleNotFoundError):
        scheduler.job_statistics("nope")


@pytest.mark.anyio
async def test_decorator_registers_job(clock: ManualClock, scheduler: Scheduler) -> None:
    """`@scheduler.job(every=...)` adds the function and returns it unchanged."""
    calls: list[str] = []

    @scheduler.job(every=5)
    async def cleanup() -> None:
        calls.append("cleanup")

    @scheduler.job("named", cron="* * * * *")
    async def other() -> None:
        calls.append("other")

    assert [job.name for job in scheduler.statistics().jobs] == ["cleanup", "named"]
    await cleanup()
    assert calls == ["cleanup"]


@pytest.mark.anyio
async def test_status_serialises_to_json(clock: ManualClock, scheduler: Scheduler) -> None:
    """`to_dict` gives plain JSON types: ISO datetimes, seconds, snake_case keys."""
    job = Counter()
    job.fail = True
    scheduler.add("flaky", job, every=10)
    await scheduler.run_now("flaky")
    scheduler.start()
    data = scheduler.statistics().to_dict()
    assert json.loads(json.dumps(data)) == data
    assert (data["started"], data["paused"], data["running"]) == (True, False, 0)
    jobs = data["jobs"]
    assert isinstance(jobs, list)
    (entry,) = jobs
    assert entry == {
        "name": "flaky",
        "every": 10.0,
        "cron": None,
        "running": False,
        "runs": 1,
        "failures": 1,
        "last_run_at": "2030-01-01T00:00:00+00:00",
        "last_duration": 0.0,
        "last_result": "error",
        "last_error": "RuntimeError: run 1 failed",
        "consecutive_failures": 1,
        "skipped_overlaps": 0,
        "next_run_at": "2030-01-01T00:00:10+00:00",
    }


@pytest.mark.anyio
async def test_job_added_late_scheduled(clock: ManualClock, scheduler: Scheduler) -> None:
    """Adding to a running scheduler arms the new job from the time it was added."""
    async with scheduler:
        await clock.advance(3)
        job = Counter()
        scheduler.add("late", job, every=10)
        await clock.advance(10)
        assert job.runs == 1


@pytest.mark.anyio
async def test_stop_waits_for_running_runs(clock: ManualClock, scheduler: Scheduler) -> None:
    """Without a timeout, stop returns only after the running run has finished."""
    job = Counter()
    job.gate = asyncio.Event()
    scheduler.add("slow", job, every=10)
    scheduler.start()
    await clock.advance(10)
    stopping = asyncio.create_task(scheduler.stop())
    await settle()
    assert not stopping.done()
    job.gate.set()
    await stopping
    assert scheduler.job_statistics("slow").last_result == "ok"


@pytest.mark.anyio
async def test_stop_timeout_cancels_run(clock: ManualClock, scheduler: Scheduler) -> None:
    """At the stop timeout a run still going is cancelled and recorded as an error."""
    job = Counter()
    job.gate = asyncio.Event()
    scheduler.add("stuck", job, every=10)
    scheduler.start()
    await clock.advance(10)
    stopping = asyncio.create_task(scheduler.stop(timeout=5))
    await settle()
    await clock.advance(5)
    await stopping
    status = scheduler.job_statistics("stuck")
    assert (status.running, status.last_result) == (False, "error")
    assert status.last_error == "CancelledError: the run was cancelled"
    assert status.last_duration == 5.0
    assert status.consecutive_failures == 1


@pytest.mark.anyio
async def test_participant_reversible(
    clock: ManualClock,
    scheduler: Scheduler,
) -> None:
    """The scheduler participant is kind schedules, counts running runs and is reversible."""
    job = Counter()
    job.gate = asyncio.Event()
    scheduler.add("slow", job, every=10)
    participant = scheduler.participant()
    assert isinstance(participant, WorkParticipant)
    assert participant.kind == "schedules"
    scheduler.start()
    await clock.advance(10)
    assert participant.in_flight() == 1
    participant.pause_intake()
    drain = asyncio.create_task(participant.finish(30))
    await settle()
    assert not drain.done()
    job.gate.set()
    await drain
    assert participant.in_flight() == 0
    await clock.advance(50)
    assert job.runs == 1
    participant.resume_intake()
    job.gate = None
    await clock.advance(10)
    assert job.runs == 2


@pytest.mark.anyio
async def test_participant_never_cancels(
    clock: ManualClock,
    scheduler: Scheduler,
) -> None:
    """A run cannot be handed over: the drain waits past its timeout and never cancels it."""
    job = Counter()
    job.gate = asyncio.Event()
    scheduler.add("slow", job, every=10)
    participant = scheduler.participant()
    scheduler.start()
    await clock.advance(10)
    participant.pause_intake()
    drain = asyncio.create_task(participant.finish(5))
    await settle()
    await clock.advance(5)
    assert not drain.done()
    assert participant.in_flight() == 1
    job.gate.set()
    await drain
    await scheduler.stop()
    assert scheduler.job_statistics("slow").last_result == "ok"


@pytest.mark.anyio
async def test_run_now_refused_in_drain(clock: ManualClock, scheduler: Scheduler) -> None:
    """Nothing is admitted after the drain closes intake: run_now raises, no run starts."""
    job = Counter()
    scheduler.add("report", job, every=60)
    scheduler.start()
    participant = scheduler.participant()
    participant.pause_intake()
    with pytest.raises(ScheduleIntakePausedError) as caught:
        await scheduler.run_now("report")
    assert caught.value.code == "SCHEDULE_INTAKE_PAUSED"
    assert job.runs == 0
    assert scheduler.statistics().intake_paused
    participant.resume_intake()
    await scheduler.run_now("report")
    assert job.runs == 1


@pytest.mark.anyio
async def test_rollback_keeps_pause(clock: ManualClock, scheduler: Scheduler) -> None:
    """A scheduler the operator paused before the drain stays paused after rollback."""
    job = Counter()
    scheduler.add("report", job, every=10)
    scheduler.start()
    scheduler.pause()
    participant = scheduler.participant()
    participant.pause_intake()
    participant.resume_intake()
    await clock.advance(100)
    assert job.runs == 0
    assert scheduler.statistics().paused
    scheduler.resume()
    await clock.advance(10)
    assert job.runs == 1


class BrokenSleepClock:
    """A manual clock whose sleeps raise: a schedule's timer dies on its first wait."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock

    def monotonic(self) -> float:
        return self.clock.monotonic()

    async def sleep(self, seconds: float) -> None:
        raise RuntimeError("the clock broke")


@pytest.mark.anyio
async def test_dead_timer_recorded(clock: ManualClock) -> None:
    """A schedule whose timer task fails says so in its statistics instead of going quiet."""
    scheduler = Scheduler(clock=BrokenSleepClock(clock), now=wall(clock))
    scheduler.add("tick", Counter(), every=5)
    scheduler.start()
    await settle()
    [job] = scheduler.statistics().jobs
    assert job.last_result == "error"
    assert job.last_error == "the schedule stopped: RuntimeError: the clock broke"
    assert job.next_run_at is None
    await scheduler.stop()
