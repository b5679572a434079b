"""Background work the drain accounts for: ``Runtime.create_task`` and ``Runtime.hold``.

Work an app starts with a bare ``asyncio.create_task`` outlives the request that started it,
is counted by nobody and is cut when the process exits. :class:`BackgroundWork` admits such
work while intake is open and refuses it (:class:`~forgezero_lifecycle.DrainingError`) from the
instant the drain closes intake, in the same step as HTTP, WebSocket, queue, job and schedule
intake. It is a :class:`~.participant.WorkParticipant` under the ``jobs`` kind, so drain status
counts it in ``inFlight.jobs`` (the four counters of the JavaScript `@forgezero/runtime`
lifecycle module, unchanged: a JavaScript generation reads the same status). The drain waits for
it; at its release margin (the cutoff) what is left is cancelled, each one logged by name.

Tasks are owned: each is kept until it is done, and one that fails is logged with its name and
counted (:meth:`BackgroundWork.statistics`), never left to asyncio's "exception was never
retrieved". A hold (``async with runtime.hold(name)``) counts work that is not a task of its own,
such as a section of a request's task that must not be cut; at the cutoff the task that holds it
is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar, final

from .._clock import Clock
from .._errors import DrainingError
from .._race import wait_event

__all__ = ["BackgroundStatistics", "BackgroundWork"]

logger = logging.getLogger("forgezero_lifecycle.background")

T = TypeVar("T")

_REFUSED: Final = (
    "the drain has closed intake; start background work before the drain, or let the next "
    "generation start it"
)


@final
@dataclass(frozen=True, slots=True)
class BackgroundStatistics:
    """A snapshot: the names running (tasks and holds), and totals since the start."""

    running: tuple[str, ...]
    completed: int
    failed: int
    cancelled: int
    refused: int


@final
class BackgroundWork:
    """Tasks and holds admitted while intake is open, waited for by the drain."""

    __slots__ = (
        "_clock",
        "_holds",
        "_idle",
        "_open",
        "_tasks",
        "cancelled",
        "completed",
        "failed",
        "refused",
    )

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._open = True
        self._tasks: dict[asyncio.Task[Any], str] = {}
        #: Each hold's name and the task that holds it (cancelled at the cutoff).
        self._holds: dict[object, tuple[str, asyncio.Task[Any] | None]] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self.completed = self.failed = self.cancelled = self.refused = 0

    @property
    def kind(self) -> Literal["jobs"]:
        return "jobs"

    def create_task(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        """Start ``coro`` as a task the drain waits for; :class:`DrainingError` once intake
        closed (``coro`` is then closed, never run)."""
        if not self._open:
            coro.close()
            self._refuse(name)
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks[task] = name
        self._idle.clear()
        task.add_done_callback(self._task_done)
        return task

    @asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        """Count the block as background work; :class:`DrainingError` once intake closed."""
        if not self._open:
            self._refuse(name)
        token = object()
        self._holds[token] = (name, asyncio.current_task())
        self._idle.clear()
        try:
            yield
        finally:
            del self._holds[token]
            self.completed += 1
            self._check_idle()

    def _refuse(self, name: str) -> None:
        self.refused += 1
        logger.warning("background.refused name=%s: %s", name, _REFUSED)
        raise DrainingError("RUNTIME_DRAINING", detail=f"{name!r}: {_REFUSED}")

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        name = self._tasks.pop(task)
        if task.cancelled():
            self.cancelled += 1
        elif (error := task.exception()) is not None:
            self.failed += 1
            logger.error("background.failed name=%s", name, exc_info=error)
        else:
            self.completed += 1
        self._check_idle()

    def _check_idle(self) -> None:
        if not self._tasks and not self._holds:
            self._idle.set()

    # WorkParticipant

    def in_flight(self) -> int:
        return len(self._tasks) + len(self._holds)

    def pause_intake(self) -> None:
        self._open = False

    def resume_intake(self) -> None:
        self._open = True

    async def finish(self, timeout: float) -> None:
        """Wait for what was admitted, ``timeout`` seconds at most (until the drain's cutoff);
        then cancel what is left, each logged by name, and wait for it to end."""
        if await wait_event(self._idle, self._clock, timeout):
            return
        for task, name in list(self._tasks.items()):
            logger.warning(
                "background.cancelled name=%s kind=task: still running at the cutoff", name
            )
            task.cancel("the drain's deadline came")
        for name, holder in list(self._holds.values()):
            logger.warning("background.cancelled name=%s kind=hold: still held at the cutoff", name)
            if holder is not None:
                holder.cancel("the drain's deadline came")
        await self._idle.wait()

    def statistics(self) -> BackgroundStatistics:
        """A frozen snapshot of the background work."""
        running = [*self._tasks.values(), *(name for name, _ in self._holds.values())]
        return BackgroundStatistics(
            running=tuple(running),
            completed=self.completed,
            failed=self.failed,
            cancelled=self.cancelled,
            refused=self.refused,
        )
