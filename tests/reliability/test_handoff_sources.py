"""Hostile handoff sources, through the control plane of a real served candidate.

Each candidate (a uvicorn process of the reliability app) is told to take over state from one
misbehaving loopback source: it stalls, lies about lengths, bombs, redirects or hangs up. The
handoff must fail with the right code within its deadline, read a bounded number of bytes, keep
memory flat and import nothing. (``tests/core/test_handoff.py`` covers the same rules in process.)
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any, Final

import anyio
import pytest

from ._fleet import Fleet, Generation, revision_of
from ._hostile import BOMB_INFLATED_BYTES, MODES, HostileSource
from ._soak import report

pytestmark = [pytest.mark.server, pytest.mark.anyio]

TIMEOUT_MS: Final = 1500
#: Scheduling slack on a shared 2-core machine between the deadline and the status poll.
SLACK: Final = 1.5
#: A candidate's peak resident memory may grow this much while it refuses a source.
MEMORY_BOUND_KIB: Final = 32 * 1024
#: The endless body: what the candidate lets the source write (its limit plus socket buffers).
ENDLESS_BOUND: Final = 16 * 1024 * 1024
STALLS: Final = ("stall-headers", "stall-body")


async def _canary() -> tuple[asyncio.Server, Counter[str]]:
    """A loopback server that only counts connections (a redirect must never reach it)."""
    hits: Counter[str] = Counter()

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hits["connections"] += 1
        writer.close()

    return await asyncio.start_server(count, "127.0.0.1", 0), hits


async def _one(candidate: Generation, url: str) -> dict[str, Any]:
    before = (await candidate.stats())["memoryKiB"]
    began = time.monotonic()
    nonce, response = await candidate.begin_handoff(
        url, revision_of("source"), timeout_ms=TIMEOUT_MS
    )
    assert response.status_code == 202, response.text
    status = await candidate.wait_handoff(nonce)
    elapsed = time.monotonic() - began
    after = await candidate.stats()
    return {
        "status": status,
        "elapsed": elapsed,
        "memory_growth_kib": after["memoryKiB"]["VmHWM"] - before["VmRSS"],
        "imported": after["imported"],
    }


@pytest.mark.timeout(90)
async def test_hostile_handoff_sources(
    fleet: Fleet,
) -> None:
    """Stalls, bombs, lying lengths, redirects and hang-ups: the right code, bounded, no import."""
    source = HostileSource()
    port = await source.start()
    canary, canary_hits = await _canary()
    source.redirect_target = f"http://127.0.0.1:{canary.sockets[0].getsockname()[1]}/export"
    candidates: dict[str, Generation] = {}
    results: dict[str, dict[str, Any]] = {}

    async def start(mode: str) -> None:
        candidates[mode] = await fleet.start(f"c-{mode}", kind="uvicorn-httptools")

    async def run(mode: str) -> None:
        results[mode] = await _one(candidates[mode], f"http://127.0.0.1:{port}/{mode}")

    try:
        async with anyio.create_task_group() as group:
            for mode in MODES:
                group.start_soon(start, mode)
        for mode in MODES:  # one at a time, so each one's timing is its own
            await run(mode)
        with anyio.fail_after(10):  # every candidate hung up on its source (no leaked socket)
            while any(source.client_closed[m] < 1 for m in (*STALLS, "endless", "gzip-bomb")):  # noqa: ASYNC110 - counters of another task's sockets
                await anyio.sleep(0.05)
    finally:
        await source.aclose()
        canary.close()
        await canary.wait_closed()

    report(
        "hostile-handoff-sources",
        cases=len(MODES),
        failures={m: r["status"].get("failure") for m, r in results.items()},
        seconds={m: round(r["elapsed"], 2) for m, r in results.items()},
        memory_growth_kib={m: r["memory_growth_kib"] for m, r in results.items()},
        endless_bytes_read=source.body_bytes_sent["endless"],
        bomb_inflated_bytes=BOMB_INFLATED_BYTES,
        imported=sum(r["imported"] is not None for r in results.values()),
    )
    wrong = {
        m: r["status"].get("failure")
        for m, r in results.items()
        if (r["status"]["status"], r["status"].get("failure")) != ("failed", MODES[m])
    }
    assert wrong == {}
    assert all(r["imported"] is None for r in results.values())
    assert {
        m: r["elapsed"] for m, r in results.items() if r["elapsed"] > TIMEOUT_MS / 1000 + SLACK
    } == {}
    assert all(results[m]["elapsed"] >= TIMEOUT_MS / 1000 * 0.9 for m in STALLS)
    assert {
        m: r["memory_growth_kib"]
        for m, r in results.items()
        if r["memory_growth_kib"] > MEMORY_BOUND_KIB
    } == {}
    assert source.body_bytes_sent["endless"] < ENDLESS_BOUND
    assert dict(source.connections) == dict.fromkeys(MODES, 1), "one request per handoff, no retry"
    assert canary_hits["connections"] == 0, "a redirect was followed"
    assert [p for c in candidates.values() for p in c.log_problems()] == []
