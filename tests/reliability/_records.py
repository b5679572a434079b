"""What each generation recorded (its ``FZREL_RECORDS`` file), read back by the tests."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ServerRecords"]


@dataclass
class ServerRecords:
    """One generation's records: request ids started and finished, jobs begun and committed."""

    started: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    finished: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    damaged: list[str] = field(default_factory=list)
    jobs_begun: list[tuple[int, int]] = field(default_factory=list)
    jobs_committed: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> ServerRecords:
        records = cls()
        if not path.exists():
            return records
        for line in path.read_text(encoding="utf-8").splitlines():
            kind, *fields = line.split()
            if kind == "S":
                records.started[fields[0]].append(float(fields[1]))
            elif kind == "F":
                records.finished[fields[0]].append(float(fields[1]))
            elif kind == "B":
                records.damaged.append(fields[0])
            elif kind == "J":
                records.jobs_begun.append((int(fields[0]), int(fields[1])))
            elif kind == "C":
                records.jobs_committed.append((int(fields[0]), int(fields[1])))
        return records

    @classmethod
    def per_pid(cls, directory: Path) -> dict[int, ServerRecords]:
        """Every worker's records in ``directory`` (``<pid>.records``, ``FZREL_RECORDS``'s
        ``{pid}`` template), by PID."""
        return {
            int(path.name.split(".")[0]): cls.read(path) for path in directory.glob("*.records")
        }

    @property
    def last_finish(self) -> float:
        """When the last request this generation ran finished (0 when none)."""
        return max((t for times in self.finished.values() for t in times), default=0.0)

    def unfinished(self) -> list[str]:
        """Admitted requests whose handler never finished."""
        return sorted(rid for rid in self.started if rid not in self.finished)

    def uncommitted_jobs(self) -> list[tuple[int, int]]:
        """(job id, fence) of jobs this generation began but never committed."""
        committed = set(self.jobs_committed)
        return [key for key in self.jobs_begun if key not in committed]
