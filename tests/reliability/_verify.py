"""Judge a load run against the servers' own records: exactly once, nothing cut, nothing lost."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ._load import RequestRecord
from ._records import ServerRecords

__all__ = ["Verdict", "judge"]


@dataclass
class Verdict:
    """Counts of one load run and every violation found (``problems`` must be empty)."""

    requests: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    completed_by: Counter[str] = field(default_factory=Counter)
    refused_then_completed: int = 0
    connect_refused: int = 0
    transport_errors: int = 0
    admitted_then_cut: int = 0
    lost: int = 0
    problems: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "by_kind": dict(self.by_kind),
            "completed_by": dict(sorted(self.completed_by.items())),
            "refused_then_completed": self.refused_then_completed,
            "connect_refused_then_completed": self.connect_refused,
            "transport_errors": self.transport_errors,
            "admitted_then_cut": self.admitted_then_cut,
            "lost": self.lost,
        }


def judge(records: Iterable[RequestRecord], servers: Mapping[str, ServerRecords]) -> Verdict:
    """Check every request against what each generation recorded.

    A request passes when the client got a complete, correct answer from one generation, that
    generation (and no other) started it exactly once and finished it, and every generation that
    refused it never started it. Problems name the request, so a failure says what happened.
    """
    verdict = Verdict()
    starts: Counter[str] = Counter()
    for server in servers.values():
        for request_id, times in server.started.items():
            starts[request_id] += len(times)
    seen: set[str] = set()
    for record in records:
        seen.add(record.id)
        verdict.requests += 1
        verdict.by_kind[record.kind] += 1
        _judge_one(record, servers, starts[record.id], verdict)
    for label, server in servers.items():
        for request_id in server.unfinished():
            verdict.problems.append(f"{label} admitted {request_id} and never finished it")
        for request_id in server.damaged:
            verdict.problems.append(f"{label} received a damaged body for {request_id}")
        for request_id in server.started:
            if request_id not in seen:
                verdict.problems.append(f"{label} ran {request_id}, which no client sent")
    return verdict


def _judge_one(
    record: RequestRecord, servers: Mapping[str, ServerRecords], starts: int, verdict: Verdict
) -> None:
    served_by = record.served_by
    for attempt in record.attempts:
        server = servers.get(attempt.target)
        admitted_here = server is not None and record.id in server.started
        if attempt.outcome == "refused" and admitted_here and attempt.target != served_by:
            # (A refusal followed by a success on the same generation leaves one start there,
            # which the exactly-once check below covers.)
            verdict.problems.append(f"{record.id} refused by {attempt.target} after it ran")
        elif attempt.outcome == "connect-refused":
            verdict.connect_refused += 1
        elif attempt.outcome.startswith("error:"):
            verdict.transport_errors += 1
            if admitted_here:
                verdict.admitted_then_cut += 1
                verdict.problems.append(
                    f"{record.id} admitted by {attempt.target} then cut: {attempt.outcome}"
                )
    if served_by is None:
        verdict.lost += 1
        verdict.problems.append(f"{record.id} ({record.kind}) lost: {record.attempts}")
        return
    verdict.completed_by[served_by] += 1
    if record.refusals:
        verdict.refused_then_completed += 1
    if starts != 1:
        verdict.problems.append(f"{record.id} ran {starts} times")
    server = servers.get(served_by)
    if server is None or record.id not in server.finished:
        verdict.problems.append(f"{record.id} answered by {served_by}, which has no record of it")


@dataclass
class StopVerdict:
    """One process stopped under load: each request answered, refused, or lost."""

    ok: int = 0
    refused: int = 0
    connect_refused: int = 0
    lost: int = 0
    problems: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "refused_503": self.refused,
            "connect_refused": self.connect_refused,
            "lost": self.lost,
        }


def judge_stop(records: Iterable[RequestRecord], server: ServerRecords) -> StopVerdict:
    """Judge single-attempt requests against the one server that was stopped.

    ``ok`` needs the server's record of starting it once and finishing it; a refusal (503 or a
    refused connection) needs the server never to have started it, so the client may retry it
    anywhere; anything else the client saw is a lost request (sent, and no answer).
    """
    verdict = StopVerdict()
    for record in records:
        outcome = record.outcome
        started = len(server.started.get(record.id, ()))
        if outcome == "ok":
            verdict.ok += 1
            if started != 1 or record.id not in server.finished:
                verdict.problems.append(f"{record.id} answered ok but ran {started} times")
        elif outcome in ("refused", "connect-refused"):
            if outcome == "refused":
                verdict.refused += 1
            else:
                verdict.connect_refused += 1
            if started:
                verdict.problems.append(f"{record.id} refused ({outcome}) after it ran")
        else:
            verdict.lost += 1
            ran = f", and the server ran it {started} times" if started else ""
            verdict.problems.append(f"{record.id} ({record.kind}) lost: {outcome}{ran}")
    for request_id in server.unfinished():
        verdict.problems.append(f"the server admitted {request_id} and never finished it")
    return verdict
