"""Public test kit: the clocks, an ASGI recorder, loop helpers.

Every controller whose deadlines a drain depends on takes a :class:`Clock`; :class:`SystemClock`
is the default and :class:`ManualClock` the one tests drive. For tests of code that enqueues or
handles durable jobs, :class:`forgezero_lifecycle.jobs.MemoryJobStore` keeps the full JobStore
contract (fences, leases, transactions that commit or roll back with the job) in memory.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import warnings
from collections.abc import MutableMapping
from typing import Any, final

from ._clock import Clock as Clock
from ._clock import SystemClock as SystemClock

__all__ = ["ASGIRecorder", "Clock", "ManualClock", "SystemClock", "settle"]


def __getattr__(name: str) -> Any:
    # The in-memory store has one import path, with the other stores.
    if name in ("MemoryJobStore", "MemoryTransaction"):
        warnings.warn(
            f"forgezero_lifecycle.testing.{name} is deprecated: import {name} from "
            "forgezero_lifecycle.jobs",
            DeprecationWarning,
            stacklevel=2,
        )
        from . import jobs

        return getattr(jobs, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@final
class ManualClock:
    """A :class:`Clock` that moves only when told to.

    ``await clock.sleep(s)`` parks until :meth:`advance` moves time past the wake-up point;
    :meth:`advance` wakes sleepers in time order and lets each run before moving on.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def monotonic(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._order), future))
        await future

    @property
    def sleepers(self) -> int:
        """How many sleeps are waiting (cancelled ones excluded)."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, waking every sleeper that falls due on the way.

        Ready tasks run first, so a task that is about to sleep is counted as a sleeper.
        """
        await settle()
        target = self._now + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            due, _, future = heapq.heappop(self._sleepers)
            self._now = max(self._now, due)
            if not future.done():
                future.set_result(None)
            await settle()
        self._now = target
        await settle()


async def settle(rounds: int = 20) -> None:
    """Let every ready task run until the loop is quiet (a bounded number of passes)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


@final
class ASGIRecorder:
    """A scripted ``receive`` and a recording ``send``, for message-level tests of ASGI apps.

    ::

        recorder = ASGIRecorder({"type": "http.request", "body": b""})
        await app(scope, recorder.receive, recorder.send)
        assert recorder.sent[0]["status"] == 200

    ``receive`` hands out the scripted messages in order and then waits for :meth:`push`.
    """

    def __init__(self, *incoming: MutableMapping[str, Any]) -> None:
        self.sent: list[MutableMapping[str, Any]] = []
        self._incoming: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
        for message in incoming:
            self._incoming.put_nowait(message)

    def push(self, message: MutableMapping[str, Any]) -> None:
        """Script one more message for ``receive``."""
        self._incoming.put_nowait(message)

    async def receive(self) -> MutableMapping[str, Any]:
        return await self._incoming.get()

    async def send(self, message: MutableMapping[str, Any]) -> None:
        self.sent.append(message)
