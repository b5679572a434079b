"""The demo's report: what happened to every request, session and job, readable at a glance."""

from __future__ import annotations

from dataclasses import dataclass, field

from .jobs import JobTally
from .load import HttpTally, WebSocketTally
from .same_port import SamePortResult

__all__ = ["HandoffResult", "Report"]


@dataclass
class HandoffResult:
    status: str
    digest: str = ""
    size: int = 0
    cursor: str = ""
    failure: str = ""


@dataclass
class Report:
    """Everything the demo measured; :attr:`nothing_lost` decides the exit code."""

    store: str
    http: HttpTally
    websockets: WebSocketTally | None
    jobs: JobTally | None
    stale_rejected: int | None
    released_by_a: int
    drain_state: str
    drain_seconds: float
    deadline_seconds: float
    handoff: HandoffResult
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    same_port: SamePortResult | None = None
    elapsed: float = 0.0

    @property
    def problems(self) -> list[str]:
        found: list[str] = []
        if self.http.lost:
            found.append(f"{self.http.lost} HTTP requests lost")
        if self.websockets is not None and self.websockets.dropped:
            found.append(f"{self.websockets.dropped} WebSockets dropped without notice")
        if self.jobs is not None and (self.jobs.lost or self.jobs.completed_twice):
            found.append(f"{self.jobs.lost} jobs lost, {self.jobs.completed_twice} run twice")
        if self.stale_rejected == 0:
            found.append("a stale commit was accepted")
        if self.drain_state != "drained":
            found.append(f"the drain of A ended {self.drain_state}")
        if self.handoff.status != "acknowledged":
            found.append(f"the handoff ended {self.handoff.status} {self.handoff.failure}".strip())
        found.extend(f"{name} exited {code}" for name, code in self.exit_codes.items() if code)
        if self.same_port is not None:
            found.extend(self.same_port.problems)
        return found

    @property
    def nothing_lost(self) -> bool:
        return not self.problems

    def render(self) -> str:
        http, ws, jobs, hand = self.http, self.websockets, self.jobs, self.handoff
        retried = http.refused_then_completed
        lines = [
            "",
            "forgezero-lifecycle demo: generation A hands over to generation B under load",
            _RULE,
            f"HTTP requests     {http.sent} sent (fast, slow and streaming, concurrently)",
            _row("completed on A", http.completed["A"]),
            _row("refused by A, completed on B", retried, "503 RUNTIME_DRAINING: never processed"),
            _row("completed on B after the switch", http.completed["B"] - retried),
            _row("lost", http.lost),
        ]
        if ws is None:
            lines.append("WebSockets        skipped (install `websockets` to include them)")
        else:
            lines += [
                f"WebSockets        {ws.opened['A']} sessions opened on A, {ws.echoes} echoes",
                _row("closed by A with 1012", ws.closed_1012, "service restart: reconnect"),
                _row("reconnected to B", ws.reconnected),
                _row("dropped without notice", ws.dropped),
            ]
        if jobs is None:
            lines.append("Durable jobs      skipped (no job store)")
        else:
            by = jobs.by_generation
            lines += [
                f"Durable jobs      {jobs.enqueued} enqueued ({self.store})",
                _row("completed exactly once", jobs.completed_once, f"A {by['A']}, B {by['B']}"),
                _row("released by A, run by B", self.released_by_a, "too long for A's deadline"),
                _row("completed twice", jobs.completed_twice),
                _row("lost", jobs.lost),
                _row(
                    "stale commits rejected",
                    self.stale_rejected or 0,
                    "a frozen worker woke after B reclaimed its job",
                ),
            ]
        if hand.status == "acknowledged":
            lines += [
                f"State handoff     acknowledged by B: cursor {hand.cursor}, {hand.size} bytes",
                f"                  {hand.digest}",
            ]
        else:
            lines.append(f"State handoff     {hand.status} {hand.failure}".rstrip())
        codes = ", ".join(f"{name} {code}" for name, code in self.exit_codes.items())
        lines += [
            f"Drain of A        {self.drain_state} in {self.drain_seconds:.1f} s "
            f"(deadline {self.deadline_seconds:g} s); exit codes {codes}",
            _RULE,
        ]
        if self.same_port is not None:
            lines += [*self.same_port.render(), _RULE]
        if self.nothing_lost:
            lines.append(f"RESULT: nothing lost (the demo took {self.elapsed:.1f} s)")
        else:
            lines.append("RESULT: FAILED: " + "; ".join(self.problems))
            problems = http.problems + (ws.problems if ws is not None else [])
            lines += [f"  - {problem}" for problem in problems[:10]]
        return "\n".join(lines)


_RULE = "=" * 78


def _row(label: str, value: int, note: str = "") -> str:
    return f"  {label:<36}{value:>6}" + (f"   ({note})" if note else "")
