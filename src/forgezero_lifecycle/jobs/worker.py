"""The job worker: claim in batches, heartbeat every lease, run handlers, finish them fenced.

``JobWorker`` is the drain's ``jobs`` participant (:class:`~forgezero_lifecycle.core.participant.
WorkParticipant`): :meth:`~JobWorker.pause_intake` stops claiming in the same synchronous step
that closes the gate (a claim already in flight is released as soon as it returns);
:meth:`~JobWorker.finish` lets running jobs finish while heartbeats continue, and shortly before
the deadline cancels what is left and releases it fenced (attempt refunded), then calls
``release_owner`` to catch a claim that raced the stop; :meth:`~JobWorker.resume_intake`
(rollback) claims again. A new generation claims released jobs at once and expired ones after
their lease.

**Enqueue keeps working while a worker drains**: ``store.enqueue`` writes to the store, not to
the worker, so jobs enqueued during a drain wait there for the next generation's claims.

The claim loop never busy-polls: after an empty claim it sleeps ``idle_interval`` on the injected
clock, and wakes at once when a job is enqueued through the same store object in this process.
Heartbeats cover every held lease in one store call per tick and continue until each job is
completed or released (stopping them at drain start would let leases expire under running jobs).
A handler whose lease is lost is cancelled.

The claim loop, the heartbeat loop and a drain's release of what is left run in one
:class:`asyncio.TaskGroup` that :meth:`~JobWorker.start` opens in the worker's own task and
:meth:`~JobWorker.stop` closes: a loop that crashes stops the others and is recorded
(``jobs.task_crashed``, :attr:`WorkerStatistics.last_error`) instead of leaving them running
unseen. Handlers run in tasks of their own, which a stop abandons (fenced) instead of awaiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
import warnings
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, Literal, TypeVar, final

from .._clock import Clock, SystemClock
from .._errors import ConfigurationError, JobStateError
from .._events import emit
from .._race import first, wait_event
from ._batcher import CompletionBatcher
from ._outcome import exponential_backoff
from ._runner import Handler, JobRunner, WorkerStatistics
from .store import ConnT, JobStore

__all__ = ["Handler", "JobWorker", "WorkerStatistics"]

logger = logging.getLogger("forgezero_lifecycle.jobs")

H = TypeVar("H", bound=Callable[..., Awaitable[Any]])

#: Whether the claim loop may claim: ``claiming`` → ``paused`` (drain) → ``claiming`` (rollback),
#: or ``stopped`` for good.
_Intake = Literal["claiming", "paused", "stopped"]


@final
class JobWorker(Generic[ConnT]):
    """Runs durable jobs from ``store`` with up to ``concurrency`` handlers at a time."""

    def __init__(
        self,
        store: JobStore[ConnT],
        handlers: Mapping[str, Handler[ConnT]] | None = None,
        *,
        concurrency: int = 8,
        lease: float = 30.0,
        heartbeat_every: float | None = None,
        owner: str | None = None,
        clock: Clock | None = None,
        idle_interval: float = 1.0,
        reclaim_every: float | None = None,
        release_margin: float = 1.0,
        backoff: Callable[[int], float] = exponential_backoff,
    ) -> None:
        heartbeat_every = lease / 3 if heartbeat_every is None else heartbeat_every
        if concurrency < 1 or lease <= 0 or idle_interval <= 0 or release_margin < 0:
            raise ConfigurationError(
                detail="need concurrency >= 1, lease > 0, idle_interval > 0, release_margin >= 0"
            )
        if not 0 < heartbeat_every < lease:
            raise ConfigurationError(detail=f"heartbeat_every must be in (0, lease={lease})")
        self._store = store
        self._concurrency = concurrency
        self._lease = lease
        self._heartbeat_every = heartbeat_every
        self._owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._clock: Clock = clock or SystemClock()
        self._idle_interval = idle_interval
        self._reclaim_every = heartbeat_every if reclaim_every is None else reclaim_every
        self._release_margin = release_margin
        #: The task that owns the worker's group, from start() to stop().
        self._main: asyncio.Task[None] | None = None
        self._group: asyncio.TaskGroup | None = None
        self._batcher = CompletionBatcher(store, f"forgezero-jobs-{self._owner}")
        self._runner = JobRunner(store, dict(handlers or {}), self._batcher, backoff, self._owner)
        self._unsubscribe: Callable[[], None] | None = None
        self._intake: _Intake = "claiming"
        #: Set by an enqueue through the store and by :meth:`resume_intake`: claim now.
        self._wake = asyncio.Event()
        self._claim_quiet = asyncio.Event()
        self._claim_quiet.set()

    # -- configuration -------------------------------------------------------------------------

    @property
    def owner(self) -> str:
        """The lease owner this worker claims as (unique per worker instance by default)."""
        return self._owner

    def handler(self, name: str) -> Callable[[H], H]:
        """Register the decorated ``async def handler(lease)`` for jobs of queue ``name``."""

        def register(fn: H) -> H:
            if name in self._runner.handlers:
                raise ConfigurationError(detail=f"a handler for {name!r} is already registered")
            self._runner.handlers[name] = fn
            return fn

        return register

    # -- WorkParticipant -----------------------------------------------------------------------

    @property
    def kind(self) -> Literal["jobs"]:
        """The drain status counter this worker adds to."""
        return "jobs"

    def in_flight(self) -> int:
        """Leases this worker holds: running handlers and jobs being completed or released."""
        return len(self._runner.runs)

    def pause_intake(self) -> None:
        """Stop claiming from this instant; running jobs continue (synchronous)."""
        if self._intake == "claiming":
            self._intake = "paused"

    def resume_intake(self) -> None:
        """Claim again (drain rollback)."""
        if self._intake == "stopped":
            return
        self._intake = "claiming"
        self._wake.set()

    async def finish(self, timeout: float) -> None:
        """Let running jobs finish; ``release_margin`` before ``timeout`` release what is left."""
        self.pause_intake()
        timeout = max(0.0, timeout)
        deadline = self._clock.monotonic() + timeout
        margin = min(self._release_margin, timeout / 4)
        runner = self._runner
        released_before = runner.counts["released"]
        await self._wait(runner.idle, deadline - margin)
        cancelled = len(runner.runs)
        if cancelled:
            runner.cancel_running()
            await self._wait(runner.idle, deadline - margin / 2)
        # Releasing can wait on a completion that holds the row (or SQLite's write) lock, so
        # in a started worker it runs as a task of the worker's group and the drain returns by
        # the deadline either way (stop() ends it); otherwise it is given until the deadline.
        finished = asyncio.Event()
        if self._group is not None:
            self._group.create_task(
                self._release_then_set(finished), name=f"forgezero-jobs-release-{self._owner}"
            )
            await self._wait(finished, deadline)
        else:
            left = max(0.0, deadline - self._clock.monotonic())
            await first(self._release_then_set(finished), self._clock.sleep(left))
        pending = not finished.is_set()
        emit(
            logger,
            logging.WARNING if pending else logging.INFO,
            "drain.jobs_released",
            owner=self._owner,
            cancelled=cancelled,
            released=runner.counts["released"] - released_before,
            pending=pending,
        )

    async def drain(self, timeout: float) -> None:
        """Deprecated name of :meth:`finish`."""
        warnings.warn(
            "JobWorker.drain(timeout) is deprecated: call finish(timeout)",
            DeprecationWarning,
            stacklevel=2,
        )
        await self.finish(timeout)

    async def _release_then_set(self, finished: asyncio.Event) -> None:
        try:
            await self._release_rest()
        finally:
            finished.set()

    async def _release_rest(self) -> None:
        runner = self._runner
        await runner.release_stuck()  # handlers that ignored cancellation: fencing is enough
        await self._claim_quiet.wait()
        try:
            raced = await self._store.release_owner(self._owner)
        except Exception as exc:
            runner.record("jobs.release_owner_failed", exc)
        else:
            if raced:
                runner.counts["released"] += raced
                logger.debug("jobs.drain.released_raced owner=%s count=%d", self._owner, raced)

    async def _wait(self, event: asyncio.Event, until: float) -> None:
        await wait_event(event, self._clock, until - self._clock.monotonic())

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start claiming, heartbeating and completing (inside a running event loop)."""
        if self._main is not None or self._intake == "stopped":
            raise JobStateError(detail="a JobWorker starts once; create a new one after stop()")
        self._batcher.start()
        self._unsubscribe = self._store.subscribe(self.wake)
        self._main = asyncio.create_task(self._run(), name=f"forgezero-jobs-{self._owner}")
        self._main.add_done_callback(self._main_ended)

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as group:
            self._group = group
            group.create_task(self._claim_loop(), name=f"forgezero-jobs-claim-{self._owner}")
            group.create_task(self._heartbeat_loop(), name=f"forgezero-jobs-hb-{self._owner}")

    def _main_ended(self, task: asyncio.Task[None]) -> None:
        self._group = None
        if not task.cancelled() and (exc := task.exception()) is not None:
            # The group's ExceptionGroup: each crash is recorded by itself.
            crashes = exc.exceptions if isinstance(exc, BaseExceptionGroup) else (exc,)
            for crash in crashes:
                self._runner.record("jobs.task_crashed", crash)

    async def stop(self, timeout: float | None = None) -> None:
        """Drain (``timeout`` defaults to the lease), then stop every background task."""
        if self._intake == "stopped":
            return
        main = self._main
        if main is not None:
            await self.finish(self._lease if timeout is None else timeout)
        self._intake = "stopped"
        if self._unsubscribe is not None:
            self._unsubscribe()
        self._runner.abandon()
        if main is not None:
            main.cancel()  # the group cancels every task in it and waits for them
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await main  # a crash was recorded when the group ended
        await self._batcher.stop()

    def wake(self) -> None:
        """Claim now instead of after the idle interval (called on enqueue in this process)."""
        self._wake.set()

    def statistics(self) -> WorkerStatistics:
        """A snapshot of this worker's counters (``running`` = leases held)."""
        return WorkerStatistics(
            owner=self._owner,
            running=len(self._runner.runs),
            paused=self._intake != "claiming",
            last_error=self._runner.last_error,
            **self._runner.counts,
        )

    # -- loops ---------------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        next_sweep = self._clock.monotonic()
        while True:
            if self._intake != "claiming":
                self._wake.clear()
                await self._wake.wait()
                continue
            free = self._runner.free_slots(self._concurrency)
            if free <= 0:
                self._runner.slot_free.clear()
                await self._runner.slot_free.wait()
                continue
            if self._clock.monotonic() >= next_sweep:
                next_sweep = self._clock.monotonic() + self._reclaim_every
                await self._sweep()
            self._wake.clear()
            if not await self._claim(free) and self._intake == "claiming":
                await wait_event(self._wake, self._clock, self._idle_interval)

    async def _sweep(self) -> None:
        try:
            count = await self._store.reclaim_expired()
        except Exception as exc:
            self._runner.record("jobs.reclaim_failed", exc)
        else:
            if count:
                logger.info("jobs.reclaimed_expired owner=%s count=%d", self._owner, count)

    async def _claim(self, free: int) -> int:
        if self._intake != "claiming":  # no await before the claim starts: none after a pause
            return 0
        self._claim_quiet.clear()
        try:
            try:
                leases = await self._store.claim(
                    self._owner, free, self._lease, queues=tuple(self._runner.handlers)
                )
            except Exception as exc:
                self._runner.record("jobs.claim_failed", exc)
                return 0
            if self._intake != "claiming":  # the gate closed while the claim was in flight
                for lease in leases:
                    await self._runner.release(lease)
                return len(leases)
            self._runner.counts["claimed"] += len(leases)
            for lease in leases:
                self._runner.start(lease)
            return len(leases)
        finally:
            self._claim_quiet.set()

    async def _heartbeat_loop(self) -> None:
        while True:
            await self._clock.sleep(self._heartbeat_every)
            leases = self._runner.held()
            if not leases:
                continue
            try:
                lost = await self._store.heartbeat(leases, self._lease)
            except Exception as exc:
                self._runner.record("jobs.heartbeat_failed", exc)
                continue
            self._runner.lost(lost)
