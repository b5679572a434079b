"""Races: two awaitables, whichever comes first.

Every "whichever comes first" wait in the library goes through :func:`first`, and the common
case of an event against a timeout through :func:`wait_event`: each starts both sides, cancels
the loser and waits for it, so no task outlives the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from ._clock import Clock

__all__ = ["first", "wait_event"]

T = TypeVar("T")


async def first(work: Awaitable[T], stop: Awaitable[object]) -> asyncio.Future[T]:
    """Run ``work`` until ``stop`` completes, whichever is first; return ``work``'s future, done.

    The future holds ``work``'s result or exception when it finished first (or in the same
    step as ``stop``), and is cancelled when ``stop`` came first; when ``stop`` raised instead of
    completing, its exception is raised. ``work`` starts first, so work that does not block
    completes even when ``stop`` is already complete. Both are finished before this returns;
    cancelling the caller cancels both.
    """
    work_task = asyncio.ensure_future(work)
    stop_task = asyncio.ensure_future(stop)
    try:
        await asyncio.wait((work_task, stop_task), return_when=asyncio.FIRST_COMPLETED)
    finally:
        work_task.cancel()  # a no-op on one that is done
        stop_task.cancel()
        await asyncio.wait((work_task, stop_task))
    if not stop_task.cancelled():
        error = stop_task.exception()
        if error is not None and work_task.cancelled():
            raise error
    return work_task


async def wait_event(event: asyncio.Event, clock: Clock, timeout: float) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass on ``clock``; True if it is set."""
    if event.is_set():
        return True
    await first(event.wait(), clock.sleep(max(timeout, 0.0)))
    return event.is_set()
