"""The clock of the drain's deadlines.

Controllers whose deadlines the drain depends on (the drain, the handoff, the runtime's graces,
the scheduler) take a :class:`Clock`, so tests drive them with a manual clock
(:class:`forgezero_lifecycle.testing.ManualClock`) instead of real sleeps. Code that waits on the
outside world in real time (job stores' idle polling, the client's and CLI's polling, the server
integration under ``serve``) reads the system clock directly.

The races against a clock's sleep ("whichever comes first") are in
:mod:`forgezero_lifecycle._race`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, final

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    """Monotonic time in seconds and a sleep on the same time line."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


@final
class SystemClock:
    """The real clock: :func:`time.monotonic` and :func:`asyncio.sleep`."""

    __slots__ = ()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
