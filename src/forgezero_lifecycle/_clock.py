"""The only reader of time in the library.

Controllers take a :class:`Clock` so tests can drive deadlines with a manual clock
(:class:`forgezero_lifecycle.testing.ManualClock`) instead of real sleeps.
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
