"""Durable fenced jobs: the store protocol, the stores and the worker.

The SQL stores are imported lazily, on first access: ``PostgresJobStore`` so the package works
without psycopg (without it the access raises :class:`ImportError` with the install hint,
``pip install 'forgezero-lifecycle[postgres]'``), ``SQLiteJobStore`` so a runtime without a
SQLite store never loads :mod:`sqlite3` (about 1 MiB resident).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .memory import MemoryJobStore as MemoryJobStore
from .memory import MemoryTransaction as MemoryTransaction
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
    from .sqlite import SQLiteJobStore as SQLiteJobStore
    from .sqlite import SQLiteTransaction as SQLiteTransaction

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

_LAZY = {
    "PgConnection": "postgres",
    "PostgresJobStore": "postgres",
    "SQLiteJobStore": "sqlite",
    "SQLiteTransaction": "sqlite",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
