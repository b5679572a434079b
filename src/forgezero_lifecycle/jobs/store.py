"""The durable job model and the :class:`JobStore` protocol every store implements.

A job is a JSON payload with an idempotency key, a state, an attempt counter, a lease and a
**fence**. The fence rises by one on every claim and never falls; every mutation after a claim
(heartbeat, complete, fail, release) names the job's ``id`` and the ``fence`` it was claimed
with, and only touches the row while ``state = 'leased'``. Zero rows updated means the lease was
lost (reclaimed after expiry, released, or completed by someone else), and the caller gets
:class:`~forgezero_lifecycle._errors.LeaseLostError`, never a silent success. This is what keeps
an old generation from committing work a new generation has reclaimed (README, "The guarantees", 4).

State machine::

    queued ──claim (fence+1, attempts+1)──▶ leased ──complete──▶ done
      ▲                                       │ ├──fail, attempts < max──▶ queued (run_after = backoff)
      │                                       │ └──fail, attempts = max──▶ dead
      └──release (attempt refunded) / expiry sweep (attempt counted; dead at max)──┘

Times (``run_after``, ``lease_until``) are Unix seconds on the store's clock: the database's
``now()`` for PostgreSQL, the wall clock (or an injected ``now``) for SQLite and memory.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar, final

__all__ = [
    "ConnT",
    "Job",
    "JobState",
    "JobStatistics",
    "JobStore",
    "Lease",
]

ConnT = TypeVar("ConnT")

JobState = Literal["queued", "leased", "done", "dead"]


@final
@dataclass(frozen=True, slots=True)
class Job:
    """A snapshot of one job row."""

    id: int
    queue: str
    payload: dict[str, Any]
    idempotency_key: str
    state: JobState
    attempts: int
    max_attempts: int
    run_after: float
    fence: int
    lease_owner: str | None
    lease_until: float | None
    last_error: str | None
    result: Any


@final
@dataclass(frozen=True, slots=True)
class JobStatistics:
    """Job counts per state, as the store held them when asked."""

    queued: int = 0
    leased: int = 0
    done: int = 0
    dead: int = 0

    @property
    def total(self) -> int:
        return self.queued + self.leased + self.done + self.dead


@final
class Lease(Generic[ConnT]):
    """The right to finish one claimed job: the job, the fence it was claimed with, the owner.

    ``async with lease.commit(result) as conn:`` opens the store's completion transaction: the
    handler writes through ``conn``, and its writes and the completion commit or roll back
    together. Entering raises :class:`LeaseLostError` if the fence is no longer current.
    """

    __slots__ = ("_committing", "_settled", "_store", "fence", "job", "owner")

    def __init__(
        self,
        store: JobStore[ConnT],
        job: Job,
        *,
        fence: int | None = None,
        owner: str | None = None,
    ) -> None:
        self._store = store
        self.job = job
        self.fence = job.fence if fence is None else fence
        self.owner = (job.lease_owner or "") if owner is None else owner
        self._settled = False
        self._committing = False

    def __repr__(self) -> str:
        return f"Lease(job={self.job.id}, fence={self.fence}, owner={self.owner!r})"

    @property
    def key(self) -> tuple[int, int]:
        """``(job id, fence)``: unique for every claim ever made."""
        return (self.job.id, self.fence)

    @property
    def settled(self) -> bool:
        """True once this lease completed, failed or was released through its store."""
        return self._settled

    @property
    def committing(self) -> bool:
        """True while a completion transaction of this lease is open."""
        return self._committing

    def commit(self, result: Any = None) -> AbstractAsyncContextManager[ConnT]:
        """Complete the job in a transaction the caller writes in (see :meth:`JobStore.complete`)."""
        return self._store.complete(self, result)

    # Called by stores only.
    def _settle(self) -> None:
        self._settled = True

    def _set_committing(self, value: bool) -> None:
        self._committing = value


class JobStore(Protocol[ConnT]):
    """A durable, fenced job store. ``ConnT`` is what a handler writes through."""

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` after every enqueue made through this object; returns unsubscribe."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[ConnT]:
        """A write transaction of the store's database, for the caller's own writes."""
        ...

    async def enqueue(
        self,
        queue: str,
        payload: Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        delay: float = 0.0,
        max_attempts: int = 5,
        conn: ConnT | None = None,
    ) -> Job:
        """Add a job, or return the existing one with the same key and the same payload.

        Raises :class:`IdempotencyConflictError` when the key exists with a different queue or
        payload. With ``conn`` (from :meth:`transaction` or a completion) the insert is part of
        that transaction. Works while a worker drains: the job waits for the next generation.
        """
        ...

    async def enqueue_many(
        self,
        queue: str,
        payloads: Sequence[Mapping[str, Any]],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
        delay: float = 0.0,
        max_attempts: int = 5,
        conn: ConnT | None = None,
    ) -> list[Job]:
        """Enqueue one job per payload in one transaction: all of them, or none.

        Each item is checked and deduplicated exactly as :meth:`enqueue` does it (its key from
        ``idempotency_keys``, same length as ``payloads``, or generated); the jobs come back
        in the order of ``payloads``. An :class:`IdempotencyConflictError` on any item writes
        nothing. With ``conn`` the batch is part of that transaction.
        """
        ...

    async def claim(
        self, owner: str, n: int, lease: float, *, queues: Collection[str] | None = None
    ) -> list[Lease[ConnT]]:
        """Lease up to ``n`` due jobs (``run_after`` first, then id) for ``lease`` seconds."""
        ...

    async def heartbeat(self, leases: Sequence[Lease[ConnT]], lease: float) -> list[Lease[ConnT]]:
        """Extend every lease still held by ``lease`` seconds; return the ones that are lost."""
        ...

    def complete(
        self, lease: Lease[ConnT], result: Any = None
    ) -> AbstractAsyncContextManager[ConnT]:
        """Fenced completion as a transaction yielding the connection the handler writes in."""
        ...

    async def complete_many(self, items: Sequence[tuple[Lease[ConnT], Any]]) -> list[Lease[ConnT]]:
        """Complete several leases (no handler writes) in one transaction; return the lost ones."""
        ...

    async def fail(self, lease: Lease[ConnT], error: str, *, retry_in: float) -> Job:
        """Record a failed attempt: queued again after ``retry_in`` s, or ``dead`` at max."""
        ...

    async def release(self, lease: Lease[ConnT]) -> None:
        """Give the job back now, refunding the attempt (drain)."""
        ...

    async def release_owner(self, owner: str) -> int:
        """Release every job leased to ``owner`` (refunded); returns how many."""
        ...

    async def reclaim_expired(self) -> int:
        """Requeue (or bury at max attempts) every expired lease; the attempt counts."""
        ...

    async def get(self, job_id: int) -> Job | None:
        """Read one job."""
        ...

    async def statistics(self) -> JobStatistics:
        """Count jobs per state (a query of the store, so awaited, unlike the worker's)."""
        ...
