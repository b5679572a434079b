"""Keyed queue throughput next to a bare ``asyncio.Semaphore``-bounded gather, side by side.

Each round gathers the same trivial coroutine (one ``asyncio.sleep(0)``) ``tasks`` times, once
through :meth:`KeyedQueue.run` and once through ``async with semaphore``, alternating which
goes first. The semaphore gets the same effective concurrency as the queue:
``min(width, keys)`` (a single key is serial by definition). The ratio is queue / bare.

Run ``python -m bench.queue [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

from forgezero_lifecycle.core.queue import KeyedQueue

__all__ = ["run"]

WIDTH = 64
TARGET = 0.5


async def _work() -> None:
    await asyncio.sleep(0)


async def _through_queue(tasks: int, keys: int) -> float:
    queue = KeyedQueue(width=WIDTH)
    names = [f"k{i}" for i in range(keys)]
    started = time.perf_counter()
    await asyncio.gather(*(queue.run(names[i % keys], _work) for i in range(tasks)))
    return tasks / (time.perf_counter() - started)


async def _through_semaphore(tasks: int, keys: int) -> float:
    semaphore = asyncio.Semaphore(min(WIDTH, keys))

    async def guarded(work: Callable[[], Awaitable[None]]) -> None:
        async with semaphore:
            await work()

    started = time.perf_counter()
    await asyncio.gather(*(guarded(_work) for _ in range(tasks)))
    return tasks / (time.perf_counter() - started)


def _measure(tasks: int, keys: int, rounds: int) -> tuple[list[float], list[float]]:
    queue_rates: list[float] = []
    bare_rates: list[float] = []
    for index in range(rounds):
        order = [(queue_rates, _through_queue), (bare_rates, _through_semaphore)]
        if index % 2:
            order.reverse()
        for sink, measure in order:
            sink.append(asyncio.run(measure(tasks, keys)))
    return queue_rates, bare_rates


def run(quick: bool) -> list[dict[str, object]]:
    """Measure and return one row per scenario (1 key, 1,000 keys)."""
    tasks, rounds = (20_000, 5) if quick else (100_000, 9)
    command = "python -m bench.queue" + (" --quick" if quick else "")
    rows: list[dict[str, object]] = []
    for keys in (1, 1_000):
        queue_rates, bare_rates = _measure(tasks, keys, rounds)
        median = statistics.median(queue_rates)
        baseline = statistics.median(bare_rates)
        rows.append(
            {
                "benchmark": f"queue.run, {keys:,} key{'s' if keys > 1 else ''}, {tasks:,} tasks",
                "metric": "throughput",
                "unit": "tasks/s",
                "min": round(min(queue_rates)),
                "median": round(median),
                "max": round(max(queue_rates)),
                "baseline_median": round(baseline),
                "ratio": round(median / baseline, 3),
                "target": TARGET,
                "command": command,
                "ok": median / baseline >= TARGET,
            }
        )
    return rows


def _print_table(rows: list[dict[str, object]]) -> None:
    columns = ["benchmark", "min", "median", "max", "baseline_median", "ratio", "target", "ok"]
    table = [columns, *([str(row[c]) for c in columns] for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
    print(
        f"unit: tasks/s; baseline: asyncio.Semaphore(min({WIDTH}, keys)) gather; ratio = median/baseline"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="20,000 tasks x 5 rounds")
    _print_table(run(parser.parse_args(argv).quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
