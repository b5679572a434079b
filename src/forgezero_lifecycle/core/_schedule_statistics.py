"""What the scheduler reports: frozen statistics of the scheduler and of each job.

These are the values :meth:`~forgezero_lifecycle.core.scheduler.Scheduler.statistics` returns
and the control plane serves as ``GET schedules/v1/status`` (each job's :meth:`to_dict`), kept
apart from the scheduling itself so the module that runs the ticks holds only that.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Literal, final

__all__ = ["ScheduledJobStatistics", "SchedulerStatistics"]


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


@final
@dataclass(frozen=True, slots=True)
class ScheduledJobStatistics:
    """One job, as somebody reading an incident needs it."""

    name: str
    every: float | None
    cron: str | None
    running: bool
    runs: int
    failures: int
    last_run_at: datetime | None
    last_duration: float | None
    last_result: Literal["ok", "error"] | None
    last_error: str | None
    consecutive_failures: int
    skipped_overlaps: int
    next_run_at: datetime | None

    def to_dict(self) -> dict[str, object]:
        """JSON-ready snake_case fields; datetimes as ISO 8601 strings, durations in seconds."""
        data = asdict(self)
        data["last_run_at"], data["next_run_at"] = _iso(self.last_run_at), _iso(self.next_run_at)
        return data


@final
@dataclass(frozen=True, slots=True)
class SchedulerStatistics:
    """The scheduler's flags and every job's statistics, in the order the jobs were added."""

    started: bool
    paused: bool
    intake_paused: bool
    running: int
    jobs: tuple[ScheduledJobStatistics, ...]

    def to_dict(self) -> dict[str, object]:
        """JSON-ready snake_case fields."""
        return {**asdict(self), "jobs": [job.to_dict() for job in self.jobs]}
