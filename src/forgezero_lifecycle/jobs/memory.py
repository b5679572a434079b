"""In-memory :class:`~forgezero_lifecycle.jobs.store.JobStore` for tests and examples.

Same contract as the SQL stores, nothing durable. The "connection" a handler writes through is a
:class:`MemoryTransaction`: writes staged with :meth:`MemoryTransaction.put` become visible in
:meth:`MemoryJobStore.table` only when the transaction commits, so a lost lease rolls them back
exactly like a database would. Time comes from ``now`` (pass a manual clock's ``monotonic``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, final

import orjson

from .._errors import IdempotencyConflictError, JobStateError, LeaseLostError
from ._enqueue import Enqueue, Listeners, prepare_enqueue, prepare_enqueue_many, queued_job
from ._outcome import error_text, result_json
from .store import Job, JobStatistics, Lease

__all__ = ["MemoryJobStore", "MemoryTransaction"]


@final
class MemoryTransaction:
    """Writes staged until the surrounding transaction commits."""

    __slots__ = ("_actions", "_active", "_tables")

    def __init__(self, tables: dict[str, dict[str, Any]]) -> None:
        self._tables = tables
        self._actions: list[Callable[[], None]] = []
        self._active = True

    def put(self, table: str, key: str, value: Any) -> None:
        """Stage ``table[key] = value``; visible in the store's table after commit."""
        self._check()
        self._actions.append(lambda: self._tables.setdefault(table, {}).__setitem__(key, value))

    def on_commit(self, action: Callable[[], None]) -> None:
        """Run ``action`` if and when the transaction commits."""
        self._check()
        self._actions.append(action)

    def _check(self) -> None:
        if not self._active:
            raise JobStateError(
                detail="this transaction has ended; write inside the `async with` block"
            )

    def _end(self, *, commit: bool) -> None:
        self._active = False
        if commit:
            for action in self._actions:
                action()
        self._actions.clear()


@final
class MemoryJobStore:
    """A dict of jobs behind the :class:`JobStore` contract (single event loop, no I/O)."""

    def __init__(self, *, now: Callable[[], float] = time.time) -> None:
        self._now = now
        self._jobs: dict[int, Job] = {}
        self._hashes: dict[int, str] = {}
        self._by_key: dict[str, int] = {}
        self._next_id = 1
        self._tables: dict[str, dict[str, Any]] = {}
        self._locked: set[int] = set()
        self._listeners = Listeners()

    async def open(self) -> None:
        """Nothing to open; present for symmetry with the SQL stores."""

    async def close(self) -> None:
        """Nothing to close."""

    async def __aenter__(self) -> MemoryJobStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def table(self, name: str) -> Mapping[str, Any]:
        """Committed rows written by handlers through :meth:`MemoryTransaction.put`."""
        return dict(self._tables.get(name, {}))

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        return self._listeners.subscribe(callback)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[MemoryTransaction]:
        tx = MemoryTransaction(self._tables)
        try:
            yield tx
        except BaseException:
            tx._end(commit=False)
            raise
        tx._end(commit=True)

    async def enqueue(
        self,
        queue: str,
        payload: Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        delay: float = 0.0,
        max_attempts: int = 5,
        conn: MemoryTransaction | None = None,
    ) -> Job:
        item = prepare_enqueue(queue, payload, idempotency_key, delay, max_attempts)
        existing = self._existing(item.idempotency_key, item.payload_digest)
        if existing is not None:
            return existing
        job = self._new_job(self._next_id, queue, item, max_attempts, self._now() + delay)
        self._next_id += 1
        self._insert({item.idempotency_key: (job, item.payload_digest)}, conn)
        return job

    async def enqueue_many(
        self,
        queue: str,
        payloads: Sequence[Mapping[str, Any]],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
        delay: float = 0.0,
        max_attempts: int = 5,
        conn: MemoryTransaction | None = None,
    ) -> list[Job]:
        prepared = prepare_enqueue_many(queue, payloads, idempotency_keys, delay, max_attempts)
        run_after = self._now() + delay
        jobs: list[Job] = []
        new: dict[str, tuple[Job, str]] = {}  # checked in full before anything changes
        for item in prepared:
            key, digest = item.idempotency_key, item.payload_digest
            existing = self._existing(key, digest)
            if existing is None and key in new:
                existing, first_digest = new[key]
                if first_digest != digest:
                    raise IdempotencyConflictError(
                        detail=f"idempotency key {key!r} was used for a different queue or payload"
                    )
            if existing is None:
                existing = self._new_job(
                    self._next_id + len(new), queue, item, max_attempts, run_after
                )
                new[key] = (existing, digest)
            jobs.append(existing)
        self._next_id += len(new)
        self._insert(new, conn)
        return jobs

    def _insert(self, new: dict[str, tuple[Job, str]], conn: MemoryTransaction | None) -> None:
        """Store ``new`` (key -> job and payload digest) now, or when ``conn`` commits; a key
        stored in between keeps its job."""

        def insert() -> None:
            for key, (job, digest) in new.items():
                if self._existing(key, digest) is None:
                    self._jobs[job.id] = job
                    self._hashes[job.id] = digest
                    self._by_key[key] = job.id
            self._listeners.notify()

        if conn is None:
            insert()
        else:
            conn.on_commit(insert)

    def _new_job(
        self, job_id: int, queue: str, item: Enqueue, max_attempts: int, run_after: float
    ) -> Job:
        payload = orjson.loads(item.payload_text)
        return queued_job(job_id, queue, payload, item.idempotency_key, max_attempts, run_after)

    def _existing(self, key: str, digest: str) -> Job | None:
        job_id = self._by_key.get(key)
        if job_id is None:
            return None
        if self._hashes[job_id] != digest:
            raise IdempotencyConflictError(
                detail=f"idempotency key {key!r} was used for a different queue or payload"
            )
        return self._jobs[job_id]

    async def claim(
        self, owner: str, n: int, lease: float, *, queues: Collection[str] | None = None
    ) -> list[Lease[MemoryTransaction]]:
        now = self._now()
        due = sorted(
            (
                j
                for j in self._jobs.values()
                if j.state == "queued"
                and j.run_after <= now
                and (queues is None or j.queue in queues)
            ),
            key=lambda j: (j.run_after, j.id),
        )[: max(0, n)]
        return [
            Lease(
                self,
                self._put(
                    job,
                    state="leased",
                    fence=job.fence + 1,
                    attempts=job.attempts + 1,
                    lease_owner=owner,
                    lease_until=now + lease,
                ),
            )
            for job in due
        ]

    def _put(self, job: Job, **changes: Any) -> Job:
        """Replace ``job`` with ``changes``; leaving ``leased`` also clears the lease."""
        if changes.get("state", "leased") != "leased":
            changes.update(lease_owner=None, lease_until=None)
        self._jobs[job.id] = job = dataclasses.replace(job, **changes)
        return job

    def _held(self, lease: Lease[MemoryTransaction], *, unlocked: bool = True) -> Job:
        job = self._jobs.get(lease.job.id)
        if (
            job is None
            or job.fence != lease.fence
            or job.state != "leased"
            or (unlocked and job.id in self._locked)
        ):
            raise LeaseLostError(
                detail=f"job {lease.job.id} is no longer leased at fence {lease.fence}"
            )
        return job

    async def heartbeat(
        self, leases: Sequence[Lease[MemoryTransaction]], lease: float
    ) -> list[Lease[MemoryTransaction]]:
        lost = []
        for held in leases:
            try:
                self._put(self._held(held, unlocked=False), lease_until=self._now() + lease)
            except LeaseLostError:
                lost.append(held)
        return lost

    @asynccontextmanager
    async def complete(
        self, lease: Lease[MemoryTransaction], result: Any = None
    ) -> AsyncIterator[MemoryTransaction]:
        self._held(lease)
        stored = _json_copy(result)
        self._locked.add(lease.job.id)  # the row lock a database would hold
        lease._set_committing(True)
        try:
            async with self.transaction() as tx:
                yield tx
                job = self._held(lease, unlocked=False)

                def finish() -> None:
                    self._put(job, state="done", result=stored)

                tx.on_commit(finish)
        finally:
            self._locked.discard(lease.job.id)
            lease._set_committing(False)
        lease._settle()

    async def complete_many(
        self, items: Sequence[tuple[Lease[MemoryTransaction], Any]]
    ) -> list[Lease[MemoryTransaction]]:
        lost = []
        stored = [_json_copy(result) for _, result in items]  # every result refused before a write
        for (lease, _), result in zip(items, stored, strict=True):
            try:
                self._put(self._held(lease), state="done", result=result)
            except LeaseLostError:
                lost.append(lease)
            else:
                lease._settle()
        return lost

    async def fail(self, lease: Lease[MemoryTransaction], error: str, *, retry_in: float) -> Job:
        job = self._held(lease)
        dead = job.attempts >= job.max_attempts
        job = self._put(
            job,
            state="dead" if dead else "queued",
            run_after=job.run_after if dead else self._now() + max(0.0, retry_in),
            last_error=error_text(error),
        )
        lease._settle()
        return job

    async def release(self, lease: Lease[MemoryTransaction]) -> None:
        job = self._held(lease)
        self._put(job, state="queued", attempts=job.attempts - 1, run_after=self._now())
        lease._settle()

    def _leased(self) -> list[Job]:
        return [j for j in self._jobs.values() if j.state == "leased" and j.id not in self._locked]

    async def release_owner(self, owner: str) -> int:
        mine = [job for job in self._leased() if job.lease_owner == owner]
        for job in mine:
            self._put(job, state="queued", attempts=job.attempts - 1, run_after=self._now())
        return len(mine)

    async def reclaim_expired(self) -> int:
        now = self._now()
        expired = [job for job in self._leased() if (job.lease_until or now) < now]
        for job in expired:
            state = "dead" if job.attempts >= job.max_attempts else "queued"
            self._put(job, state=state, run_after=now, last_error="lease expired")
        return len(expired)

    async def get(self, job_id: int) -> Job | None:
        return self._jobs.get(job_id)

    async def statistics(self) -> JobStatistics:
        counts = dict.fromkeys(("queued", "leased", "done", "dead"), 0)
        for job in self._jobs.values():
            counts[job.state] += 1
        return JobStatistics(**counts)


def _json_copy(value: Any) -> Any:
    """What a database would hand back: the result through JSON (refused as the stores do)."""
    text = result_json(value)
    return None if text is None else orjson.loads(text)
