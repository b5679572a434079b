"""A burst of connections spreads over the workers of ``serve --workers 2``.

50 keep-alive connections are opened at once (every handshake completes before the first
request is written, so all of them can wait in the shared socket's accept queue together), then
each sends one request to ``/busy`` (about 1 ms of CPU) and reads which worker answered. A
worker that takes every queued connection in one wake-up serves the whole burst alone; each
worker must take at least 30 % of it, right after the first answer at start-up and for the new
generation right after a SIGHUP handover.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from typing import Final
from urllib.parse import urlsplit

import httpx
import pytest

from forgezero_lifecycle.core._httpx import tls_context
from forgezero_lifecycle.stop.server import DEFER_LIMIT, Tally, may_accept

from .conftest import BOUND, StartSupervised, Supervised

# The two bursts are load tests too: 50 connections and a CPU-bound handler against real
# workers, whose share means something only when they are not starved of CPU by a crowd of other
# such tests. The rest of the module is the accept rule alone, in-process.

CONNECTIONS: Final = 50
#: Each worker's least share of the burst (of two workers: an even split is 50 %).
LEAST_SHARE: Final = 0.3
#: Bursts per scenario: the split must hold every time, not on average.
ROUNDS: Final = 3
_REQUEST: Final = b"GET /busy HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def _ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    writer.write(_REQUEST)
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b" ", 2)[1]
    assert status == b"200", head
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    pid: int = json.loads(await reader.readexactly(length))["pid"]
    return pid


async def _burst(url: str) -> Counter[int]:
    """Open every connection at once, then one request on each: which worker answered each."""
    parts = urlsplit(url)
    async with asyncio.timeout(BOUND):
        connections = await asyncio.gather(
            *(asyncio.open_connection(parts.hostname, parts.port) for _ in range(CONNECTIONS))
        )
        try:
            answered = await asyncio.gather(*(_ask(r, w) for r, w in connections))
        finally:
            for _, writer in connections:
                writer.close()
    return Counter(answered)


def _first_answer(served: Supervised) -> None:
    """Wait for the first 200 (bounded): the moment a user's load begins."""
    deadline = time.monotonic() + BOUND
    while True:
        assert served.process.poll() is None, served.log()
        try:
            if httpx.get(
                served.url + "/busy", timeout=BOUND, trust_env=False, verify=tls_context()
            ).is_success:
                return
        except httpx.TransportError:
            assert time.monotonic() < deadline, f"no answer within {BOUND} s:\n{served.log()}"
            time.sleep(0.01)


def _assert_spread(shares: Counter[int], workers: list[int], served: Supervised) -> None:
    assert set(shares) <= set(workers), (shares, workers)
    least = min(shares.get(pid, 0) for pid in workers)
    assert least >= LEAST_SHARE * CONNECTIONS, f"{dict(shares)} over {workers}:\n{served.log()}"


@pytest.mark.server
@pytest.mark.load
@pytest.mark.timeout(180)  # three fresh servers, each started and stopped: ~15 s each when quiet
def test_burst_at_startup(start_supervised: StartSupervised) -> None:
    """Right after the first answer, the burst lands on both workers, each ≥ 30 %, every round
    (each round a fresh server)."""
    for _ in range(ROUNDS):
        served = start_supervised(workers=2, wait=False)
        _first_answer(served)
        shares = asyncio.run(_burst(served.url))
        served.wait_log("supervisor.serving")
        _assert_spread(shares, served.workers(), served)
        served.signal(signal.SIGTERM)
        assert served.wait_exit() == 0, served.log()


@pytest.mark.server
@pytest.mark.load
def test_burst_after_handover(start_supervised: StartSupervised) -> None:
    """After a SIGHUP handover, a burst lands on both workers of the new generation."""
    served = start_supervised("--handover-grace", "0.2s", workers=2)
    old = set(served.workers())
    served.signal(signal.SIGHUP)
    served.wait_log("supervisor.new_generation_ready")
    served.wait_for(
        lambda: served.log().count("worker.stopped_accepting") == len(old),
        "the old generation no longer accepting",
    )
    new = [pid for pid in served.workers() if pid not in old]
    assert len(new) == 2, served.log()
    for _ in range(ROUNDS):
        _assert_spread(asyncio.run(_burst(served.url)), new, served)


@pytest.mark.parametrize(
    ("mine", "siblings", "deferred", "accepts"),
    [
        (5, [], 0.0, True),  # no sibling accepts: take it
        (1, [0], 0.0, True),  # within the slack
        (2, [0, 9], 0.0, False),  # the least-loaded sibling should take it
        (2, [0], DEFER_LIMIT, True),  # the sibling had its chance
    ],
)
def test_may_accept(mine: int, siblings: list[int], deferred: float, accepts: bool) -> None:
    assert may_accept(mine, siblings, deferred) is accepts


def test_tally_slots() -> None:
    """What the supervisor creates, a worker sees through its own descriptor."""
    tally, file = Tally.create(3)
    worker = Tally.attach(os.dup(file.fileno()), 3, 1)
    sibling = Tally.attach(os.dup(file.fileno()), 3, 0)
    try:
        assert worker.siblings() == []  # nobody accepts yet
        sibling.publish(4)
        worker.publish(2)
        assert worker.siblings() == [4]
        tally.clear(0)
        assert worker.siblings() == []
    finally:
        worker.close()
        sibling.close()
        tally.close()
        file.close()
