"""What the command line writes: progress while waiting, the final status, one-line errors.

The exit code follows from the final status (:func:`report`); every line that may carry
server-supplied text passes through :func:`printable` first.
"""

from __future__ import annotations

import argparse
import sys
import time
import unicodedata
from typing import Final, TextIO

import orjson

from ..wire.drain import DrainStatus
from ..wire.handoff import StateHandoffStatus
from ..wire.supervisor import HandoverStatus

__all__ = [
    "EXIT_FAILED",
    "EXIT_GAVE_UP",
    "EXIT_OK",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "Progress",
    "fail",
    "handover_summary",
    "oldest_in_flight",
    "printable",
    "report",
    "shared_listener_advice",
    "summary",
]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3
EXIT_GAVE_UP: Final = 4

_OK_STATES: Final = frozenset({"drained", "acknowledged"})


class Progress:
    """While waiting: one live line on a TTY, one line per change elsewhere.

    Only the states still in motion are shown: the settled one is the result line
    :func:`report` prints, once.
    """

    def __init__(self, stream: TextIO, *, deadline: float) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._deadline = deadline
        self._started = time.monotonic()
        self._last = ""
        self._live = False

    def drain(self, status: DrainStatus) -> None:
        if status.status == "draining":
            line = f"{status.status}  {_counters(status.in_flight.model_dump())}"
            blocking = oldest_in_flight(status.detail)
            self._show(f"{line}  {blocking}" if blocking else line)

    def handoff(self, status: StateHandoffStatus) -> None:
        if status.status == "pending":
            self._show(status.status)

    def handover(self, status: HandoverStatus) -> None:
        if status.state == "running":
            self._show(f"{status.state}  {_generations(status)}")

    def _show(self, line: str) -> None:
        clock = f"{time.monotonic() - self._started:.1f}s / {self._deadline:g}s"
        if self._tty:
            self._stream.write(f"\r\x1b[2K{line}  {clock}")
            self._live = True
        elif line != self._last:
            self._stream.write(f"{line}  {clock}\n")
        self._last = line
        self._stream.flush()

    def close(self) -> None:
        if self._live:
            self._stream.write("\n")
            self._stream.flush()
            self._live = False


def summary(status: dict[str, object]) -> str:
    """The final status as one line: state, failure code, counters, digest, nonce."""
    parts = [str(status["status"])]
    if "failure" in status:
        parts.append(f"failure={status['failure']}")
    if isinstance(in_flight := status.get("inFlight"), dict):
        parts.append(_counters(in_flight))
    parts.extend(f"{key}={status[key]}" for key in ("cursor", "digest", "nonce") if key in status)
    blocking = oldest_in_flight(status.get("detail"))
    if blocking:
        parts.append(blocking)
    return "  ".join(parts)


def oldest_in_flight(detail: object) -> str:
    """``detail.oldestInFlight`` as one phrase (``oldest: GET /items/{item_id} 12.3s, ...``),
    or "" when the status names none."""
    items = detail.get("oldestInFlight") if isinstance(detail, dict) else None
    if not isinstance(items, list) or not items:
        return ""
    named = [_in_flight_item(item) for item in items[:5] if isinstance(item, dict)]
    return "oldest: " + ", ".join(named) if named else ""


def _in_flight_item(item: dict[str, object]) -> str:
    kind, method, route, age = (item.get(k) for k in ("kind", "method", "route", "ageMs"))
    who = str(method) if kind == "http" and method else str(kind)
    where = str(route) if route else "(no route template)"
    seconds = f"{age / 1000:.1f}s" if isinstance(age, int | float) else "age unknown"
    return f"{who} {where} {seconds}"


def shared_listener_advice(status: dict[str, object]) -> str | None:
    """The line that says the drain reached one worker of several (``detail.sharedListener``
    of a runtime under ``uvicorn --workers`` or ``gunicorn -w``), or None."""
    detail = status.get("detail")
    shared = detail.get("sharedListener") if isinstance(detail, dict) else None
    if not isinstance(shared, dict):
        return None
    siblings = shared.get("siblingPids")
    pids = ", ".join(str(pid) for pid in siblings) if isinstance(siblings, list) else "?"
    return f"sharedListener: sibling workers {pids} share this worker's socket; {shared.get('advice', '')}"


def _counters(counters: dict[str, object]) -> str:
    return " ".join(f"{kind}={count}" for kind, count in counters.items())


def report(args: argparse.Namespace, status: dict[str, object]) -> int:
    """Print the final status; the exit code follows from it."""
    state = str(status["status"])
    if getattr(args, "json", False):
        sys.stdout.write(orjson.dumps(status).decode() + "\n")
    else:
        print(printable(summary(status)))
        advice = shared_listener_advice(status)
        if advice is not None:
            print(printable(advice))
    if state in _OK_STATES or (args.command == "rollback" and state == "rolled-back"):
        return EXIT_OK
    if state in ("draining", "pending"):
        return EXIT_OK if args.command != "status" and args.no_wait else EXIT_GAVE_UP
    return EXIT_FAILED


def handover_summary(status: HandoverStatus) -> str:
    """One line for a handover's final (or, with ``--no-wait``, current) status."""
    line = f"handover {status.handover} {status.state}: {_generations(status)}"
    if status.seconds is not None:
        line += f" in {status.seconds:.1f}s"
    if status.failure:
        line += f"; {status.failure}"
        if status.detail:
            line += f": {status.detail}"
    elif status.detail:
        line += f"; {status.detail}"
    return line


def _generations(status: HandoverStatus) -> str:
    to = "?" if status.to_generation is None else str(status.to_generation)
    return f"generation {status.from_generation} -> {to}"


def fail(code: int, message: str) -> int:
    """Print ``message`` as one error line on stderr; returns ``code``."""
    line = " ".join(printable(message).split())  # one line, whatever a server put in its detail
    print(f"forgezero-lifecycle: error: {line}", file=sys.stderr)
    return code


def printable(text: str) -> str:
    """``text`` safe for a terminal: whitespace becomes a space, other control and format
    characters (escape sequences, bidirectional overrides) are dropped.

    Server-supplied text (an error ``detail``, a ``failure``) passes through here before it is
    printed, so a server cannot write to the operator's terminal.
    """
    return "".join(
        " " if c.isspace() else c
        for c in text
        if c.isspace() or not unicodedata.category(c).startswith("C")
    )
