"""Durable fenced jobs (layer 1b): the store protocol, the stores and the worker.

``PostgresJobStore`` is imported lazily, on first access, so the package works without psycopg;
without it the access raises :class:`ImportError` with the install hint
(``pip install 'forgezero-lifecycle[postgres]'``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .memory import MemoryJobStore as MemoryJobStore
from .memory import MemoryTransaction as MemoryTransaction
from .sqlite import SQLiteJobStore as SQLiteJobStore
from .sqlite import SQLiteTransaction as SQLiteTransaction
from .store import Job as Job
from .store import JobState as JobState
from .store import JobStats as JobStats
from .store import JobStore as JobStore
from .store import Lease as Lease
from .store import exponential_backoff as exponential_backoff
from .worker import Handler as Handler
from .worker import JobWorker as JobWorker
from .worker import WorkerStats as WorkerStats

if TYPE_CHECKING:
    from .postgres import PgConnection as PgConnection
    from .postgres import PostgresJobStore as PostgresJobStore

__all__ = [
    "Handler",
    "Job",
    "JobState",
    "JobStats",
    "JobStore",
    "JobWorker",
    "Lease",
    "MemoryJobStore",
    "MemoryTransaction",
    "PgConnection",
    "PostgresJobStore",
    "SQLiteJobStore",
    "SQLiteTransaction",
    "WorkerStats",
    "exponential_backoff",
]

_LAZY = frozenset({"PgConnection", "PostgresJobStore"})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import postgres

        return getattr(postgres, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
