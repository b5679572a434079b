"""Durable fenced jobs: the store protocol, the stores and the worker.

Every name is imported on first access (:mod:`forgezero_lifecycle._lazy`): ``PostgresJobStore``
so the package works without psycopg (without it the access raises :class:`ImportError` with the
install hint, ``pip install 'forgezero-lifecycle[postgres]'``), ``SQLiteJobStore`` so a runtime
without a SQLite store never loads :mod:`sqlite3` (about 1 MiB resident).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import attach

if TYPE_CHECKING or not attach(__name__):
    from ._outcome import exponential_backoff as exponential_backoff
    from .memory import MemoryJobStore as MemoryJobStore
    from .memory import MemoryTransaction as MemoryTransaction
    from .postgres import PgConnection as PgConnection
    from .postgres import PostgresJobStore as PostgresJobStore
    from .sqlite import SQLiteJobStore as SQLiteJobStore
    from .sqlite import SQLiteTransaction as SQLiteTransaction
    from .store import Job as Job
    from .store import JobState as JobState
    from .store import JobStatistics as JobStatistics
    from .store import JobStore as JobStore
    from .store import Lease as Lease
    from .worker import Handler as Handler
    from .worker import JobWorker as JobWorker
    from .worker import WorkerStatistics as WorkerStatistics
