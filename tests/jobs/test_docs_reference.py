"""What the docs say of durable jobs is what the code does.

docs/jobs.md's ``JobWorker`` reference names every constructor option with its real default, and
docs/drain.md's table of when a drain cancels and releases running jobs holds for a real
``Runtime`` and ``JobWorker`` on a manual clock.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from forgezero_lifecycle.jobs import JobWorker, Lease, MemoryJobStore
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.testing import ManualClock, settle

JOBS_PAGE = (Path(__file__).resolve().parents[2] / "docs" / "jobs.md").read_text()


def test_reference_lists_options() -> None:
    """docs/jobs.md's JobWorker reference lists every option with its default, in the signature
    and in the table: a new option, or a changed default, must show in the reference too."""
    start = JOBS_PAGE.index("## `JobWorker` reference")
    section = JOBS_PAGE[start : JOBS_PAGE.index("\n## ", start + 1)]
    signature = section[
        section.index("```python") : section.index("```\n", section.index("```python") + 9)
    ]
    rows = dict(re.findall(r"^\| `(\w+)` \|([^|]*)\|", section, re.MULTILINE))
    for name, parameter in inspect.signature(JobWorker).parameters.items():
        assert name in rows, name
        default = parameter.default
        if default is inspect.Parameter.empty:
            assert rows[name].strip() == "", name
            assert re.search(rf"\b{name}[,)]", signature), name
        else:
            shown = getattr(default, "__name__", repr(default))
            assert rows[name].strip().split(":")[0] == f"`{shown}`", (name, rows[name], shown)
            assert f"{name}={shown}" in signature, (name, shown)


DRAIN_PAGE = (Path(__file__).resolve().parents[2] / "docs" / "drain.md").read_text()


def _release_table() -> list[tuple[int, float]]:
    """(timeoutMs, seconds after begin at which jobs are cancelled) from docs/drain.md."""
    start = DRAIN_PAGE.index("| `timeoutMs` | `m` |")
    rows = re.findall(
        r"^\| ([\d,]+) \| [^|]+ \| [^|]+ \| [^|]+ \| ([\d.]+) s \| ([\d.]+) s \|$",
        DRAIN_PAGE[start:],
        re.MULTILINE,
    )
    assert len(rows) >= 3
    table = []
    for timeout, cancelled_at, before in rows:
        timeout_ms = int(timeout.replace(",", ""))
        assert float(cancelled_at) + float(before) == pytest.approx(timeout_ms / 1000)
        table.append((timeout_ms, float(cancelled_at)))
    return table


@pytest.mark.anyio
@pytest.mark.parametrize(("timeout_ms", "cancelled_at"), _release_table())
async def test_cancel_time_as_documented(timeout_ms: int, cancelled_at: float) -> None:
    """Jobs are cancelled when docs/drain.md's deadline table says: a Runtime's drain and its
    JobWorker (default release_margin) on one manual clock."""
    clock = ManualClock(start=1000.0)
    runtime = Runtime(control_token="docs-reference-token-0123456789", clock=clock)
    store = MemoryJobStore(now=clock.monotonic)
    worker: JobWorker[Any] = JobWorker(store, clock=clock, lease=600.0)
    cancelled = asyncio.Event()

    async def forever(lease: Lease[Any]) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    worker.handler("q")(forever)
    runtime.add(worker)
    await store.enqueue("q", {})
    worker.start()
    try:
        while worker.in_flight() == 0:
            await settle()
        runtime.drain.begin(
            {
                "protocol": "forgezero-drain/v1",
                "nonce": "D" * 43,
                "sourceRevision": "a" * 40,
                "targetRevision": "b" * 40,
                "timeoutMs": timeout_ms,
            }
        )
        await clock.advance(cancelled_at - 0.01)
        await settle()
        assert not cancelled.is_set()
        await clock.advance(0.01)
        await settle()
        assert cancelled.is_set()
    finally:
        await clock.advance(timeout_ms / 1000)
        await worker.stop(timeout=0)
        await runtime.aclose()
