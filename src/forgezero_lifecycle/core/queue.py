"""Keyed work queue: a memory-only ``createQueue`` as an asyncio API.

The queue is the JavaScript `@forgezero/runtime` lifecycle module's.

``await queue.run(key, handler, *args)`` returns the handler's result or raises its exception.
Tasks of one key run strictly in submission order, one at a time; different keys run in
parallel, at most ``width`` at once. The handler runs in the submitting task itself (no task is
created per submission), so cancelling the caller cancels its own work, and a refused
submission raises at the ``await`` without leaving a future or task behind.

Refusals follow the JavaScript module's precedence: :class:`QueueStoppedError` (after :meth:`stop`
or :meth:`abort`) wins over :class:`QueueIntakePausedError` (after :meth:`pause_intake`), which wins
over :class:`QueueKeyStoppedError` (after :meth:`stop_key`). :meth:`pause` and :meth:`pause_key`
hold work instead of refusing it.

The intake pause is the handoff fence: accepted work continues, nothing new is admitted, so
:meth:`wait_idle` is an exact boundary, and :meth:`resume_intake` reverses it (except after
:meth:`stop`, which is final).
"""

from __future__ import annotations

import asyncio
import warnings
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import TypeVar, TypeVarTuple, final

from .._clock import Clock, SystemClock
from .._errors import (
    ConfigurationError,
    QueueIntakePausedError,
    QueueKeyStoppedError,
    QueueStoppedError,
    TaskCancelledError,
)
from .._race import wait_event
from .participant import ParticipantKind

__all__ = ["KeyedQueue", "QueueDrainReport", "QueueParticipant", "QueueStatistics"]

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")


@final
@dataclass(frozen=True, slots=True)
class QueueStatistics:
    """How much is outstanding, for a health endpoint or a drain decision."""

    width: int
    running: int
    queued: int
    keys: int
    paused: bool
    intake_paused: bool
    paused_keys: tuple[str, ...]
    stopped_keys: tuple[str, ...]
    completed: int
    failed: int

    def to_dict(self) -> dict[str, object]:
        """JSON-ready snake_case fields (tuples become lists)."""
        paused, stopped = list(self.paused_keys), list(self.stopped_keys)
        return {**asdict(self), "paused_keys": paused, "stopped_keys": stopped}


@final
@dataclass(frozen=True, slots=True)
class QueueDrainReport:
    """What :meth:`KeyedQueue.drain` did: tasks finished (ok or error) while draining, queued
    tasks cancelled at the deadline, handlers still running at the deadline (left to finish)."""

    completed: int
    cancelled: int
    running: int


@final
class _Lane:
    """The waiters of one key, in submission order."""

    __slots__ = ("key", "ready", "running", "waiters")

    def __init__(self, key: str) -> None:
        self.key = key
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.running = False
        self.ready = False  # listed in KeyedQueue._ready


@final
class KeyedQueue:
    """Parallel across keys (at most ``width`` running), strictly serial within a key."""

    def __init__(self, *, width: int = 16, clock: Clock | None = None) -> None:
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ConfigurationError(detail=f"queue width must be a positive int, got {width!r}")
        self._width = width
        self._clock: Clock = SystemClock() if clock is None else clock
        self._lanes: dict[str, _Lane] = {}
        self._ready: deque[_Lane] = deque()
        self._running = 0
        self._queued = 0
        self._paused = False
        self._paused_keys: set[str] = set()
        self._stopped_keys: set[str] = set()
        self._accepting = True
        self._intake_paused = False
        self._completed = 0
        self._failed = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def width(self) -> int:
        """How many keys may run at once."""
        return self._width

    async def run(self, key: str, handler: Callable[[*_Ts], Awaitable[_T]], *args: *_Ts) -> _T:
        """Run ``handler(*args)`` after the earlier tasks of ``key``; return or raise its outcome.

        A refusal is raised before anything is queued; :class:`TaskCancelledError` if
        :meth:`abort` or :meth:`drain` cancels the task while it waits.
        """
        if not self._accepting or self._intake_paused or key in self._stopped_keys:
            raise self._refusal(key)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(key)
        if (
            not self._paused
            and self._running < self._width
            and not lane.running
            and not lane.waiters
            and key not in self._paused_keys
        ):
            lane.running = True
            self._running += 1
            self._idle.clear()
        else:
            await self._wait_turn(lane)
        try:
            result = await handler(*args)
        except BaseException:
            self._failed += 1
            self._finish(lane)
            raise
        self._completed += 1
        self._finish(lane)
        return result

    def in_flight(self) -> int:
        """Accepted tasks not yet finished: running plus queued."""
        return self._running + self._queued

    def pause(self) -> None:
        """Hold everything: running handlers finish, submissions are accepted and wait."""
        self._paused = True

    def resume(self) -> None:
        """Undo :meth:`pause`."""
        self._paused = False
        self._pump()

    def pause_key(self, key: str) -> None:
        """Hold the queued tasks of ``key``; its running task finishes."""
        self._paused_keys.add(key)
        lane = self._lanes.get(key)
        if lane is not None:
            lane.ready = False

    def resume_key(self, key: str) -> None:
        """Undo :meth:`pause_key`."""
        self._paused_keys.discard(key)
        lane = self._lanes.get(key)
        if lane is not None:
            self._mark_ready(lane)
            self._pump()

    def stop_key(self, key: str) -> None:
        """Refuse new work for ``key`` with :class:`QueueKeyStoppedError`; queued work runs."""
        self._stopped_keys.add(key)

    def pause_intake(self) -> None:
        """Refuse new submissions with :class:`QueueIntakePausedError`; accepted work runs on."""
        self._intake_paused = True

    def resume_intake(self) -> None:
        """Undo :meth:`pause_intake`; does nothing once the queue is stopped."""
        if not self._accepting:
            return
        self._intake_paused = False
        self._pump()

    def stop(self) -> None:
        """Refuse all new work with :class:`QueueStoppedError`, for good; accepted work runs."""
        self._accepting = False

    def abort(self) -> int:
        """Stop, and fail every queued task with :class:`TaskCancelledError`; return how many.

        Running handlers are not interrupted."""
        self._accepting = False
        cancelled = 0
        for lane in list(self._lanes.values()):
            lane.ready = False
            while lane.waiters:
                waiter = lane.waiters.popleft()
                if not waiter.done():
                    waiter.set_exception(TaskCancelledError())
                    cancelled += 1
            if not lane.running:
                self._drop(lane)
        self._ready.clear()
        self._queued = 0
        self._check_idle()
        return cancelled

    async def wait_idle(self) -> None:
        """Return once nothing is running or queued (at once if that is already so)."""
        await self._idle.wait()

    async def drain(self, timeout: float) -> QueueDrainReport:
        """Stop, wait up to ``timeout`` seconds for accepted work, then cancel what is queued."""
        finished_before = self._completed + self._failed
        self.stop()
        idle = await wait_event(self._idle, self._clock, timeout)
        cancelled = 0 if idle else self.abort()
        return QueueDrainReport(
            completed=self._completed + self._failed - finished_before,
            cancelled=cancelled,
            running=self._running,
        )

    def statistics(self) -> QueueStatistics:
        """A frozen copy of the counters and flags."""
        return QueueStatistics(
            width=self._width,
            running=self._running,
            queued=self._queued,
            keys=len(self._lanes),
            paused=self._paused,
            intake_paused=self._intake_paused,
            paused_keys=tuple(sorted(self._paused_keys)),
            stopped_keys=tuple(sorted(self._stopped_keys)),
            completed=self._completed,
            failed=self._failed,
        )

    def participant(self) -> QueueParticipant:
        """This queue as a drain :class:`~.participant.WorkParticipant` (kind ``jobs``)."""
        return QueueParticipant(self)

    def _refusal(self, key: str) -> Exception:
        if not self._accepting:
            return QueueStoppedError()
        if self._intake_paused:
            return QueueIntakePausedError()
        return QueueKeyStoppedError(key)

    async def _wait_turn(self, lane: _Lane) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        lane.waiters.append(waiter)
        self._queued += 1
        self._idle.clear()
        self._mark_ready(lane)
        self._pump()
        try:
            await waiter
        except BaseException:
            if not waiter.done() or waiter.cancelled():
                self._forget(lane, waiter)
            elif waiter.exception() is None:
                self._finish(lane)  # granted a turn, then cancelled before running
            raise

    def _mark_ready(self, lane: _Lane) -> None:
        if (
            lane.waiters
            and not lane.running
            and not lane.ready
            and lane.key not in self._paused_keys
        ):
            lane.ready = True
            self._ready.append(lane)

    def _pump(self) -> None:
        if self._paused:
            return
        while self._running < self._width and self._ready:
            lane = self._ready.popleft()
            if not lane.ready:
                continue  # paused or emptied since it was listed
            lane.ready = False
            waiters = lane.waiters
            while waiters and waiters[0].done():  # cancelled callers not yet resumed
                waiters.popleft()
                self._queued -= 1
            if not waiters:
                self._drop(lane)
                continue
            waiter = waiters.popleft()
            self._queued -= 1
            lane.running = True
            self._running += 1
            waiter.set_result(None)
        self._check_idle()

    def _finish(self, lane: _Lane) -> None:
        lane.running = False
        self._running -= 1
        if lane.waiters:
            self._mark_ready(lane)
        else:
            self._drop(lane)
        self._pump()

    def _forget(self, lane: _Lane, waiter: asyncio.Future[None]) -> None:
        try:
            lane.waiters.remove(waiter)
        except ValueError:
            return  # already taken off by _pump or abort
        self._queued -= 1
        if not lane.waiters and not lane.running:
            lane.ready = False
            self._drop(lane)
        self._check_idle()

    def _drop(self, lane: _Lane) -> None:
        if self._lanes.get(lane.key) is lane:
            del self._lanes[lane.key]

    def _check_idle(self) -> None:
        if self._running == 0 and self._queued == 0:
            self._idle.set()


@final
class QueueParticipant:
    """A :class:`KeyedQueue` seen by the drain: kind ``jobs``, in flight = running + queued."""

    __slots__ = ("_queue",)

    def __init__(self, queue: KeyedQueue) -> None:
        self._queue = queue

    @property
    def kind(self) -> ParticipantKind:
        return "jobs"

    def in_flight(self) -> int:
        return self._queue.in_flight()

    def pause_intake(self) -> None:
        self._queue.pause_intake()

    async def finish(self, timeout: float) -> None:
        """Wait for :meth:`KeyedQueue.wait_idle`; queued work is kept and never cancelled.

        Memory work cannot be handed to the next generation, so this waits past ``timeout``
        and lets the drain's own deadline decide (failed ``RUNTIME_DRAIN_TIMEOUT``, with the
        work still counted under ``jobs``).
        """
        await self._queue.wait_idle()

    async def drain(self, timeout: float) -> None:
        """Deprecated name of :meth:`finish`."""
        warnings.warn(
            "QueueParticipant.drain(timeout) is deprecated: call finish(timeout)",
            DeprecationWarning,
            stacklevel=2,
        )
        await self.finish(timeout)

    def resume_intake(self) -> None:
        self._queue.resume_intake()
