"""Rows, verdicts, the console table and the BENCHMARKS.md writer shared by every benchmark.

A row is a plain dict with the keys of :data:`ROW_KEYS` (``run(quick)`` of every module returns a
list of them) and, optionally, ``ok`` (the module's own verdict, a bool) and ``note`` (one line
saying how the figure was obtained: load generator, rounds, baseline). Modules that do not set
``ok`` get a verdict parsed from their ``target`` text (``ratio ≤ 1.01``, ``<= 3x``,
``≤ 1000 ns``); a row without a checkable target is shown as ``—``. A comparison that could not
run (a peer not installed, no PostgreSQL, a module that failed) is still a row, made by
:func:`not_run`: ``not run`` in the verdict column and the reason in its note.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from bench._meanings import MEANINGS, meaning, missed_because

__all__ = [
    "ROW_KEYS",
    "figures",
    "machine",
    "markdown",
    "not_run",
    "paired",
    "print_table",
    "row",
    "verdict",
]

ROW_KEYS: Final = (
    "benchmark",
    "metric",
    "unit",
    "min",
    "median",
    "max",
    "baseline_median",
    "ratio",
    "target",
    "command",
)
_PACKAGES: Final = (
    "forgezero-lifecycle",
    "starlette",
    "fastapi",
    "uvicorn",
    "httptools",
    "uvloop",
    "pydantic",
    "orjson",
    "httpx",
    "psycopg",
    "procrastinate",
    "gunicorn",
    "uvicorn-worker",
    "granian",
)
_COMPARE: Final = re.compile(r"(≤|<=|≥|>=)\s*([0-9][0-9.,]*)\s*(x|%|[A-Za-z/]+)?")
_RATIO_TARGET: Final = re.compile(r"ratio\s*(≤|<=|≥|>=)\s*([0-9][0-9.]*)")


def row(
    benchmark: str,
    metric: str,
    unit: str,
    samples: Sequence[float],
    *,
    baseline: float | None,
    ratio: float | None,
    target: str,
    command: str,
    ok: bool | None = None,
    note: str = "",
) -> dict[str, Any]:
    """One result row: min/median/max of ``samples``, the baseline median and the ratio."""
    out: dict[str, Any] = {
        "benchmark": benchmark,
        "metric": metric,
        "unit": unit,
        "min": min(samples),
        "median": statistics.median(samples),
        "max": max(samples),
        "baseline_median": baseline,
        "ratio": ratio,
        "target": target,
        "command": command,
    }
    if ok is not None:
        out["ok"] = ok
    if note:
        out["note"] = note
    return out


def not_run(benchmark: str, reason: str, command: str) -> dict[str, Any]:
    """The row of a comparison that could not be measured, saying why (never left out)."""
    return {
        "benchmark": benchmark,
        "metric": "not run",
        "unit": "",
        "min": None,
        "median": None,
        "max": None,
        "baseline_median": None,
        "ratio": None,
        "target": "—",
        "command": command,
        "not_run": reason,
        "note": reason,
    }


def paired(ours: Sequence[float], base: Sequence[float]) -> list[float]:
    """Per-round ratios ours/base of two interleaved series (the only figures noise spares)."""
    return [a / b for a, b in zip(ours, base, strict=True) if b]


def verdict(result: dict[str, Any]) -> str:
    """``met``, ``MISSED``, ``not run`` or ``—`` (no checkable target) for one row."""
    if result.get("not_run"):
        return "not run"
    target = result.get("target")
    if target is None or str(target).strip() in ("", "baseline", "(comparison)", "—"):
        return "—"
    if isinstance(result.get("ok"), bool):
        return "met" if result["ok"] else "MISSED"
    if isinstance(target, int | float):  # a bare number: the ratio must reach it
        return _judge(result.get("ratio"), ">=", float(target))
    text = str(target)
    if match := _RATIO_TARGET.search(text):
        return _judge(result.get("ratio"), match.group(1), float(match.group(2)))
    if match := _COMPARE.search(text):
        op, number, unit = match.group(1), float(match.group(2).replace(",", "")), match.group(3)
        if unit == "x":
            return _judge(result.get("ratio"), op, number)
        if unit == "%":
            return _judge(result.get("ratio"), op, number / 100)
        return _judge(result.get("median"), op, number)
    return "—"


def _judge(value: object, op: str, limit: float) -> str:
    if not isinstance(value, int | float):
        return "—"
    ok = value <= limit if op in ("≤", "<=") else value >= limit
    return "met" if ok else "MISSED"


def _fmt(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float):
        number = float(value)
        if abs(number) >= 1000:
            return f"{number:,.0f}"
        if abs(number) >= 100:
            return f"{number:.1f}"
        if abs(number) >= 1 or number == 0:
            return f"{number:.2f}"
        return f"{number:.3g}"
    return str(value)


def figures(result: dict[str, Any]) -> list[str]:
    """The display cells of one row, in table order (without the command)."""
    return [
        str(result["benchmark"]),
        str(result["metric"]),
        _fmt(result["min"]),
        _fmt(result["median"]),
        _fmt(result["max"]),
        str(result["unit"]),
        _fmt(result["baseline_median"]),
        _fmt(result["ratio"]),
        str(result["target"]),
        verdict(result),
    ]


_HEADER: Final = [
    "benchmark",
    "metric",
    "min",
    "median",
    "max",
    "unit",
    "baseline",
    "ratio",
    "target",
    "met",
]


def print_table(rows: Iterable[dict[str, Any]], out: Any = None) -> None:
    """A plain aligned table on ``out`` (stdout by default), then the notes."""
    stream = out or sys.stdout
    rows = list(rows)
    table = [_HEADER, *(figures(r) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(_HEADER))]
    numeric = {2, 3, 4, 6, 7}
    for line in table:
        cells = [
            cell.rjust(width) if index in numeric else cell.ljust(width)
            for index, (cell, width) in enumerate(zip(line, widths, strict=True))
        ]
        print("  ".join(cells).rstrip(), file=stream)
    notes = [r for r in rows if r.get("note")]
    if notes:
        print(file=stream)
    for r in notes:
        print(f"- {r['benchmark']} / {r['metric']}: {r['note']}", file=stream)


# -- the machine ------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    """What the figures were measured on: CPU, cores, OS, Python, library versions, tools."""
    info = {
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count()),
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }
    for name in _PACKAGES:
        try:
            info[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info[name] = "not installed"
    info["wrk"] = _wrk_version() or "not installed"
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _wrk_version() -> str | None:
    path = shutil.which("wrk")
    if path is None:
        return None
    done = subprocess.run([path, "-v"], capture_output=True, text=True, timeout=10, check=False)
    first = (done.stdout or done.stderr).splitlines()
    return first[0].split(" [")[0] if first else "unknown"


# -- BENCHMARKS.md ----------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _meaning_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The section saying, per benchmark, what its rows measure and what the ratio means."""
    listed = [
        key for key in MEANINGS if any(meaning(str(r["benchmark"])) == MEANINGS[key] for r in rows)
    ]
    if not listed:
        return []
    lines = ["", "## What the rows measure", ""]
    for key in listed:
        measured, ratio = MEANINGS[key]
        lines.append(f"- **{key.rstrip('.')}**: {measured}. Ratio: {ratio}.")
    return lines


def markdown(
    rows: Sequence[dict[str, Any]],
    info: dict[str, str],
    *,
    command: str,
    elapsed: float,
    skipped: Sequence[str] = (),
) -> str:
    """The whole BENCHMARKS.md: how to run, the machine, the table, the notes."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    missed = [r for r in rows if verdict(r) == "MISSED"]
    lines = [
        "# Benchmarks",
        "",
        f"Written by `{command}` on {stamp} ({elapsed / 60:.1f} min). Regenerate with "
        "`make bench` (add `FORGEZERO_BENCH_POSTGRES_DSN=postgresql://…` for the PostgreSQL "
        "rows); `make bench-quick` is a smoke run that prints the table and writes nothing.",
        "",
        "Every figure is measured side by side with its baseline in the same run, interleaved "
        "round by round, because this machine is shared and noisy: single runs vary by ±20 %, "
        "so only the ratio to the baseline of the same rounds means anything. `min`, `median` "
        "and `max` are over the rounds of the figure; `ratio` is ours / baseline (for paired "
        "figures, the median of the per-round ratios); `met` compares the figure named by the "
        "target with it.",
        "",
        "## Machine",
        "",
        "| what | value |",
        "|---|---|",
        *(f"| {key} | {_cell(value)} |" for key, value in info.items()),
        "",
        "## Results",
        "",
        "| " + " | ".join([*_HEADER, "reproduce"]) + " |",
        "|" + "---|" * (len(_HEADER) + 1),
    ]
    for r in rows:
        cells = [*figures(r), f"`{r['command']}`"]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    judged = sum(verdict(r) in ("met", "MISSED") for r in rows)
    lines += ["", f"Targets missed: {len(missed)} of {judged}."]
    not_measured = [r for r in rows if verdict(r) == "not run"]
    if not_measured:
        lines.append(f"Rows not run: {len(not_measured)} (each says why in the notes).")
    for r in missed:
        reason = missed_because(r)
        because = f"; missed because {reason}" if reason else ""
        lines.append(
            f"- {r['benchmark']} / {r['metric']}: {_fmt(r['median'])} vs {r['target']}{because}"
        )
    lines += _meaning_lines(rows)
    notes = [r for r in rows if r.get("note")]
    if notes or skipped:
        lines += ["", "## Notes", ""]
    lines += [f"- **{r['benchmark']} / {r['metric']}**: {r['note']}" for r in notes]
    lines += [f"- skipped: {reason}" for reason in skipped]
    return "\n".join(lines) + "\n"
