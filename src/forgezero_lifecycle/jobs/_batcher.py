"""Group plain completions into one fenced transaction, and a clock-driven event wait.

A handler that returns without opening ``lease.commit()`` wrote nothing in the job's
transaction, so its completion can share a transaction with others: every row is still checked
against its own ``id``, ``fence`` and ``state = 'leased'``, and a lost one fails alone. The
batcher is always either idle or writing one batch; completions that arrive while it writes
form the next batch, so batching adds no waiting when the store is idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Generic, final

from .._errors import JobStoreError, LeaseLostError
from .store import ConnT, JobStore, Lease

__all__ = ["CompletionBatcher"]

logger = logging.getLogger("forgezero_lifecycle.jobs")

#: Most completions written in one transaction.
MAX_BATCH = 256

_Item = tuple[Lease[ConnT], Any, "asyncio.Future[None]"]


@final
class CompletionBatcher(Generic[ConnT]):
    """Writes queued completions with :meth:`JobStore.complete_many`, one batch at a time."""

    def __init__(self, store: JobStore[ConnT], name: str) -> None:
        self._store = store
        self._name = name
        self._pending: list[_Item[ConnT]] = []
        self._writing: list[_Item[ConnT]] = []
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"{self._name}-completions")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        error = JobStoreError(detail="the job worker stopped before this completion was written")
        for _, _, future in (*self._writing, *self._pending):
            if not future.done():
                future.set_exception(error)
        self._writing, self._pending = [], []

    async def complete(self, lease: Lease[ConnT], result: Any) -> None:
        """Complete ``lease`` in the next batch; raises :class:`LeaseLostError` if it was lost."""
        if self._task is None:
            raise JobStoreError(detail="the job worker is not running; call start() first")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((lease, result, future))
        self._ready.set()
        await future

    async def _loop(self) -> None:
        while True:
            await self._ready.wait()
            self._writing = self._pending[:MAX_BATCH]
            del self._pending[:MAX_BATCH]
            if not self._pending:
                self._ready.clear()
            batch = [
                (lease, result) for lease, result, future in self._writing if not future.done()
            ]
            try:
                lost = await self._store.complete_many(batch) if batch else []
            except Exception as exc:
                logger.warning("jobs.complete_batch_failed size=%d error=%r", len(batch), exc)
                for _, _, future in self._writing:
                    if not future.done():
                        future.set_exception(exc)
            else:
                lost_keys = {lease.key for lease in lost}
                for lease, _, future in self._writing:
                    if future.done():
                        continue
                    if lease.key in lost_keys:
                        future.set_exception(
                            LeaseLostError(
                                detail=f"job {lease.job.id} lost its lease at fence {lease.fence}"
                            )
                        )
                    else:
                        future.set_result(None)
            self._writing = []
