"""The jobs a worker holds: one task per lease, and how each one ends (fenced, always)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Literal, final

from .._errors import JobHandlerUnknownError, LeaseLostError
from ._batcher import CompletionBatcher
from ._outcome import result_json
from .store import ConnT, JobStore, Lease

__all__ = ["Handler", "JobRunner", "WorkerStatistics"]

logger = logging.getLogger("forgezero_lifecycle.jobs")

Handler = Callable[[Lease[ConnT]], Awaitable[Any]]
CancelReason = Literal["drain", "lost"]


@final
@dataclass(frozen=True, slots=True)
class WorkerStatistics:
    """A snapshot of one worker's counters."""

    owner: str
    running: int
    paused: bool
    claimed: int
    completed: int
    failed: int
    released: int
    lost: int
    last_error: str | None


class _Run(Generic[ConnT]):
    __slots__ = ("cancel_reason", "completing", "lease", "task")

    def __init__(self, lease: Lease[ConnT]) -> None:
        self.lease = lease
        self.task: asyncio.Task[None] | None = None
        self.cancel_reason: CancelReason | None = None
        self.completing = False  # the handler returned; its completion is being written

    def cancel(self, reason: CancelReason) -> None:
        if self.task is not None and not self.task.done() and self.cancel_reason is None:
            self.cancel_reason = reason
            self.task.cancel()


@final
class JobRunner(Generic[ConnT]):
    """Runs each claimed lease as a task and ends it with complete, fail or release.

    A lease stays in :attr:`runs` (and so in heartbeats and ``in_flight``) until it is
    completed, failed, released or lost; only then is its slot free.
    """

    def __init__(
        self,
        store: JobStore[ConnT],
        handlers: dict[str, Handler[ConnT]],
        batcher: CompletionBatcher[ConnT],
        backoff: Callable[[int], float],
        owner: str,
    ) -> None:
        self._store = store
        self.handlers = handlers
        self._batcher = batcher
        self._backoff = backoff
        self._owner = owner
        self.runs: dict[tuple[int, int], _Run[ConnT]] = {}
        self.idle = asyncio.Event()
        self.idle.set()
        self.slot_free = asyncio.Event()
        self.completing = 0  # handlers returned, completion not yet written
        self.counts = dict.fromkeys(("claimed", "completed", "failed", "released", "lost"), 0)
        self.last_error: str | None = None

    def start(self, lease: Lease[ConnT]) -> None:
        run = _Run(lease)
        self.runs[lease.key] = run
        self.idle.clear()
        run.task = asyncio.create_task(self._run(run), name=f"forgezero-job-{lease.job.id}")

    def free_slots(self, concurrency: int) -> int:
        """Handler slots free now. A returned handler frees its slot while its completion is
        written (so claiming overlaps completing); at most ``2 * concurrency`` leases are held.
        """
        running = len(self.runs) - self.completing
        return max(0, min(concurrency - running, 2 * concurrency - len(self.runs)))

    def held(self) -> list[Lease[ConnT]]:
        """Leases to heartbeat: every one not yet completed, failed or released."""
        return [run.lease for run in self.runs.values() if not run.lease.settled]

    def lost(self, leases: Iterable[Lease[ConnT]]) -> None:
        """Cancel the handlers of leases a heartbeat found lost (unless already finishing)."""
        for lease in leases:
            run = self.runs.get(lease.key)
            if run is None or lease.settled or lease.committing or run.completing:
                continue
            logger.warning("jobs.lease_lost job=%d fence=%d", lease.job.id, lease.fence)
            run.cancel("lost")

    def cancel_running(self) -> None:
        """Cancel every handler still running (drain deadline); each releases its lease."""
        for run in list(self.runs.values()):
            if not run.completing:
                run.cancel("drain")

    def abandon(self) -> None:
        """Cancel every task still holding a lease (worker stop); expiry returns the jobs."""
        for run in list(self.runs.values()):
            if run.task is not None:
                run.task.cancel()

    async def release_stuck(self) -> None:
        """Release the leases of handlers that did not end when cancelled (fencing is enough)."""
        for run in list(self.runs.values()):
            if not run.completing:
                await self.release(run.lease)

    async def _run(self, run: _Run[ConnT]) -> None:
        lease = run.lease
        try:
            handler = self.handlers.get(lease.job.queue)
            if handler is None:
                raise JobHandlerUnknownError(
                    detail=f"no handler is registered for {lease.job.queue!r}"
                )
            result = await handler(lease)
            if not lease.settled:
                result_json(result)  # JOB_INVALID unless JSON data: fails this job, not its batch
                run.completing = True
                self.completing += 1
                self.slot_free.set()
                try:
                    await self._batcher.complete(lease, result)
                finally:
                    self.completing -= 1
            self.counts["completed"] += 1
        except asyncio.CancelledError:
            if run.cancel_reason is None:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # we cancelled it ourselves and handle it here
            if run.cancel_reason == "drain":
                await self.release(lease)
            else:
                self.counts["lost"] += 1
        except LeaseLostError:
            self.counts["lost"] += 1
            logger.warning("jobs.lease_lost job=%d fence=%d", lease.job.id, lease.fence)
        except Exception as exc:
            if lease.settled:
                logger.exception("jobs.handler_error_after_commit job=%d", lease.job.id)
            else:
                await self._fail(lease, exc)
        finally:
            self.runs.pop(lease.key, None)
            self.slot_free.set()
            if not self.runs:
                self.idle.set()

    async def _fail(self, lease: Lease[ConnT], exc: Exception) -> None:
        logger.warning(
            "jobs.handler_failed job=%d queue=%s attempt=%d",
            lease.job.id,
            lease.job.queue,
            lease.job.attempts,
            exc_info=exc,
        )
        try:
            job = await self._store.fail(
                lease, f"{type(exc).__name__}: {exc}", retry_in=self._backoff(lease.job.attempts)
            )
        except LeaseLostError:
            self.counts["lost"] += 1
        except Exception as store_exc:
            self.record("jobs.fail_failed", store_exc)
        else:
            self.counts["failed"] += 1
            if job.state == "dead":
                logger.error("jobs.dead job=%d attempts=%d", job.id, job.attempts)

    async def release(self, lease: Lease[ConnT]) -> None:
        """Fenced release (attempt refunded); a lease already lost or finished is left alone."""
        if lease.settled:
            return
        try:
            await self._store.release(lease)
        except LeaseLostError:
            return
        except Exception as exc:
            self.record("jobs.release_failed", exc)
            return
        self.counts["released"] += 1

    def record(self, event: str, exc: BaseException) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"
        logger.warning("%s owner=%s error=%r", event, self._owner, exc)
