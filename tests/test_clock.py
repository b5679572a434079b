"""The one "whichever comes first" helper: outcomes, cancellation, and nothing left running."""

from __future__ import annotations

import asyncio

import pytest

from forgezero_lifecycle._race import first, wait_event
from forgezero_lifecycle.testing import ManualClock

pytestmark = pytest.mark.anyio


async def test_work_first_wins() -> None:
    """Work that finishes first gives its result and stops the other."""
    stop = asyncio.get_running_loop().create_future()

    async def work() -> str:
        return "done"

    outcome = await first(work(), stop)
    assert outcome.result() == "done"
    assert stop.cancelled()


async def test_work_raises_first() -> None:
    """Work that raises first keeps its exception."""

    async def work() -> None:
        raise ValueError("broken")

    outcome = await first(work(), asyncio.Event().wait())
    with pytest.raises(ValueError, match="broken"):
        outcome.result()


async def test_stop_first_cancels_work() -> None:
    """Stop first cancels the work and waits for it."""
    finished: list[str] = []

    async def work() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            finished.append("cleaned up")

    outcome = await first(work(), asyncio.sleep(0))
    assert outcome.cancelled()
    assert finished == ["cleaned up"]  # awaited before first() returned


async def test_nonblocking_work_wins() -> None:
    """Work that does not block wins over a stop already done."""
    done = asyncio.Event()
    done.set()

    async def work() -> int:
        return 7

    assert (await first(work(), done.wait())).result() == 7


async def test_stop_raises_after_cancel() -> None:
    """A stop that raises is raised once the work is cancelled."""

    async def stop() -> None:
        raise RuntimeError("the clock broke")

    with pytest.raises(RuntimeError, match="the clock broke"):
        await first(asyncio.Event().wait(), stop())


async def test_caller_cancel_cancels_both() -> None:
    """Cancelling the caller cancels both."""
    started = asyncio.Event()
    work = asyncio.ensure_future(asyncio.Event().wait())
    stop = asyncio.ensure_future(asyncio.Event().wait())

    async def caller() -> None:
        started.set()
        await first(work, stop)

    task = asyncio.ensure_future(caller())
    await started.wait()
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert work.cancelled()
    assert stop.cancelled()


async def test_wait_event_manual_clock() -> None:
    """wait_event on a manual clock."""
    clock = ManualClock()
    event = asyncio.Event()
    waiting = asyncio.ensure_future(wait_event(event, clock, 5.0))
    await asyncio.sleep(0)
    await clock.advance(4.0)
    assert not waiting.done()
    event.set()
    assert await waiting is True
    assert clock.sleepers == 0

    timed_out = asyncio.ensure_future(wait_event(asyncio.Event(), clock, 1.0))
    await asyncio.sleep(0)
    await clock.advance(1.0)
    assert await timed_out is False
    assert clock.sleepers == 0


async def test_wait_event_set_or_timed_out() -> None:
    """wait_event with the event already set or no time left."""
    clock = ManualClock()
    event = asyncio.Event()
    assert await wait_event(event, clock, -1.0) is False
    event.set()
    assert await wait_event(event, clock, 0.0) is True
