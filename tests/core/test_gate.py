"""The intake gate: atomic admission, statistics and event-driven idleness."""

from __future__ import annotations

import asyncio
import random

import pytest

from forgezero_lifecycle.core.gate import IntakeGate
from forgezero_lifecycle.testing import settle

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("seed", range(20))
async def test_no_admission_after_close(seed: int) -> None:
    """However admissions interleave with close(), none succeeds once close() has returned."""
    rng = random.Random(seed)
    gate = IntakeGate()
    log: list[str] = []

    async def client(n: int) -> None:
        for _ in range(rng.randrange(5)):
            await asyncio.sleep(0)
        if gate.try_admit("http" if n % 2 else "websocket"):
            log.append("admitted")

    async def closer() -> None:
        for _ in range(rng.randrange(5)):
            await asyncio.sleep(0)
        gate.close()
        log.append("closed")

    await asyncio.gather(*(client(n) for n in range(50)), closer())
    closed_at = log.index("closed")
    assert "admitted" not in log[closed_at + 1 :]
    stats = gate.statistics()
    assert stats.http + stats.websocket == log.count("admitted")


async def test_wait_idle_wakes_on_release() -> None:
    """wait_idle() is an event: it returns at the release of the last unit, not by polling."""
    gate = IntakeGate()
    assert gate.try_admit("http")
    assert gate.try_admit("websocket")
    waiter = asyncio.ensure_future(gate.wait_idle())
    gate.release("http")
    await settle()
    assert not waiter.done()
    gate.release("websocket")
    await settle()
    assert waiter.done()


async def test_reopen_admits_again() -> None:
    """Rollback reopens the gate: admission resumes and the notice and draining flags clear."""
    gate = IntakeGate()
    gate.close()
    gate.end_streams()
    assert not gate.try_admit("http")
    assert gate.draining
    gate.reopen()
    assert gate.try_admit("http")
    assert not gate.notice.is_set()
    assert not gate.draining
    stats = gate.statistics()
    assert (stats.http, stats.websocket) == (1, 0)


async def test_draining_still_admits() -> None:
    """Readiness off (not-ready grace) still admits; only close() refuses."""
    gate = IntakeGate()
    gate.begin_draining()
    assert gate.draining
    assert gate.try_admit("http")


async def test_draining_event_tracks_flag() -> None:
    """One fact: begin_draining and close set the event with the flag, reopen clears both."""
    gate = IntakeGate()
    assert not gate.draining_event.is_set()
    gate.begin_draining()
    assert (gate.draining, gate.draining_event.is_set()) == (True, True)
    gate.reopen()
    assert (gate.draining, gate.draining_event.is_set()) == (False, False)
    gate.close()
    assert (gate.draining, gate.draining_event.is_set()) == (True, True)


async def test_running_set_members_count() -> None:
    """A running set's members are HTTP requests in flight: in the statistics, and wait_idle()
    waits for them as for units admitted by try_admit()."""
    gate = IntakeGate()
    running = gate.running_set()
    first, second = object(), object()
    running.update((first, second))
    assert gate.try_admit("http")
    assert gate.statistics().http == 3
    waiter = asyncio.ensure_future(gate.wait_idle())
    await settle()
    assert gate.waiting_idle
    gate.release("http")
    running.discard(first)
    gate.released()
    await settle()
    assert not waiter.done()
    running.discard(second)
    gate.released()
    await settle()
    assert waiter.done()
    assert not gate.waiting_idle
    assert gate.statistics().http == 0


async def test_serving_open_not_draining() -> None:
    """The one test a running set's owner makes before it adds a member follows every moment."""
    gate = IntakeGate()
    assert gate.serving
    gate.begin_draining()
    assert not gate.serving
    assert gate.is_open
    gate.reopen()
    assert gate.serving
    gate.close()
    assert not gate.serving
    assert not gate.is_open
    gate.reopen()
    assert gate.serving


async def test_wait_idle_outside_drain() -> None:
    """waiting_idle tells the owner to call released() whether or not a drain is on."""
    gate = IntakeGate()
    running = gate.running_set()
    member = object()
    running.add(member)
    waiter = asyncio.ensure_future(gate.wait_idle())
    await settle()
    assert gate.waiting_idle
    assert gate.serving
    running.discard(member)
    gate.released()
    await settle()
    assert waiter.done()


async def test_wait_idle_given_up() -> None:
    """A wait_idle() cancelled (a drain that timed out, say) takes its waiter with it: the
    request path stops calling released() at once, not at the next time the gate goes idle."""
    gate = IntakeGate()
    running = gate.running_set()
    running.add(object())
    first = asyncio.ensure_future(gate.wait_idle())
    second = asyncio.ensure_future(gate.wait_idle())
    await settle()
    first.cancel()
    await settle()
    assert gate.waiting_idle  # the second still waits
    second.cancel()
    await settle()
    assert not gate.waiting_idle
    assert gate.statistics().http == 1  # the member is still in flight, nobody waits for it
