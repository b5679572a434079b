"""The thread, connections and transactions under :class:`~.sqlite.SQLiteJobStore`.

Every statement runs on **one dedicated thread** (:class:`StatementThread`), not through
:func:`asyncio.to_thread`. A :class:`sqlite3.Connection` belongs to the thread that opened it,
and a completion transaction spans several awaits (``BEGIN IMMEDIATE``, the handler's writes, the
fenced ``UPDATE``, ``COMMIT``); one thread keeps every statement on the same connection in
submission order, so a rollback queued after a cancelled statement always runs after it. The
default executor would hop threads and need ``check_same_thread=False`` plus a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar, final

from .._errors import JobStateError, JobStoreError, LeaseLostError
from . import _sqlite_sql as q

__all__ = ["SQLiteDatabase", "SQLiteTransaction", "StatementThread"]

logger = logging.getLogger("forgezero_lifecycle.jobs")
T = TypeVar("T")
_NOT_OPEN = "the SQLite job store is not open; await store.open() first"


@final
class SQLiteTransaction:
    """The open write transaction a handler (or ``store.transaction()``) writes in."""

    __slots__ = ("_active", "_after_commit", "_db")

    def __init__(self, db: SQLiteDatabase) -> None:
        self._db = db
        self._active = True
        self._after_commit: list[Callable[[], None]] = []

    async def execute(
        self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()
    ) -> list[tuple[Any, ...]]:
        """Run one statement in the transaction and return all its rows."""
        self._check()
        return await self._db.call(_fetchall, self._db.writer(), sql, params)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement once per parameter row."""
        self._check()
        await self._db.call(_executemany, self._db.writer(), sql, rows)

    def _check(self) -> None:
        if not self._active:
            raise JobStateError(
                detail="this transaction has ended; write inside the `async with` block"
            )

    def _end(self, *, committed: bool) -> None:
        self._active = False
        actions, self._after_commit = self._after_commit, []
        if committed:
            for action in actions:
                action()


def _fetchall(conn: sqlite3.Connection, sql: str, params: Any) -> list[tuple[Any, ...]]:
    return conn.execute(sql, params).fetchall()


def _executemany(conn: sqlite3.Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    conn.executemany(sql, rows)


_Call = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


@final
class StatementThread:
    """One thread running submitted calls in submission order, answering with asyncio futures.

    A single-worker :class:`~concurrent.futures.ThreadPoolExecutor` does the same with a
    ``concurrent.futures.Future`` chained to an asyncio one per call (two futures, a lock and
    two callbacks): on a busy 2-core machine that doubles the hop, about half an enqueue's own
    CPU time. Here a call is a queue item and its answer one ``call_soon_threadsafe``.

    The thread is a daemon so a store never closed cannot keep the interpreter alive; a
    statement cut short at interpreter exit was never confirmed to its caller, and SQLite's
    commit is atomic, so nothing acknowledged is lost. :meth:`stop` ends it after the calls
    already queued, and so does dropping the object (a store never closed leaks no thread).
    """

    __slots__ = ("__weakref__", "_calls")

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        threading.Thread(target=_serve, args=(self._calls,), name=name, daemon=True).start()
        weakref.finalize(self, self._calls.put, None)

    def submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue ``fn(*args)`` behind every earlier call; the future holds its outcome."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._calls.put((loop, future, fn, args))
        return future

    def stop(self) -> None:
        self._calls.put(None)


def _serve(calls: queue.SimpleQueue[_Call | None]) -> None:
    """The thread's body: run each call, hand its outcome to its loop, until ``None``."""
    while (call := calls.get()) is not None:
        loop, future, fn, args = call
        try:
            outcome, failed = fn(*args), False
        except BaseException as exc:  # handed to the awaiting task, as an executor does
            outcome, failed = exc, True
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody awaits it any more
            loop.call_soon_threadsafe(_settle, future, outcome, failed)
        del call, loop, future, fn, args, outcome  # hold nothing while waiting for the next


def _settle(future: asyncio.Future[Any], outcome: Any, failed: bool) -> None:
    if future.cancelled():  # the caller stopped waiting; the statement ran all the same
        return
    if failed:
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


@final
class SQLiteDatabase:
    """One writer and one read-only connection, both living on one private thread."""

    def __init__(self, path: str, *, busy_ms: int, synchronous: str) -> None:
        self.path = path
        self._busy_ms = busy_ms
        self._synchronous = synchronous
        self._thread: StatementThread | None = None
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()
        self._holder: asyncio.Task[Any] | None = None

    async def open(self) -> None:
        if self._thread is not None:
            return
        if sqlite3.sqlite_version_info < (3, 35, 0):
            raise JobStoreError("JOB_STORE_SCHEMA", f"SQLite {sqlite3.sqlite_version} < 3.35")
        self._thread = StatementThread("forgezero-jobs-sqlite")
        try:
            await self.op(self._open_sync)
        except BaseException:
            await self.close()
            raise

    def _open_sync(self) -> None:
        self._writer = self._connect()
        mode = self._writer.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            logger.warning("jobs.sqlite.no_wal path=%s journal_mode=%s", self.path, mode)
        q.migrate(self._writer)
        self._reader = self._connect()
        self._reader.execute("PRAGMA query_only=ON")

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True)
        conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        return conn

    async def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            await thread.submit(self._close_sync)
        finally:
            thread.stop()

    def _close_sync(self) -> None:
        for conn in (self._reader, self._writer):
            if conn is not None:
                conn.close()
        self._reader = self._writer = None

    def writer(self) -> sqlite3.Connection:
        if self._writer is None:
            raise JobStoreError(detail=_NOT_OPEN)
        return self._writer

    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue ``fn(*args)`` on the thread (FIFO) and return its future."""
        if self._thread is None:
            raise JobStoreError(detail=_NOT_OPEN)
        return self._thread.submit(fn, *args)

    async def op(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a store statement on the thread; database failures become JobStoreError."""
        thread = self._thread
        if thread is None:
            raise JobStoreError(detail=_NOT_OPEN)
        try:
            return await thread.submit(fn, *args)
        except sqlite3.Error as exc:
            raise JobStoreError(detail=f"SQLite: {exc}") from exc

    async def read(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """A query on the read-only connection (never waits for the writer)."""
        return await self.op(self._read_sync, sql, args)

    def _read_sync(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if self._reader is None:
            raise JobStoreError(detail=_NOT_OPEN)
        return self._reader.execute(sql, args).fetchall()

    @asynccontextmanager
    async def locked(self) -> AsyncIterator[None]:
        """Own the writer connection (a transaction spans awaits, so an asyncio lock)."""
        task = asyncio.current_task()
        if task is not None and task is self._holder:
            raise JobStateError(
                detail="this task already holds a transaction of this SQLiteJobStore; "
                "pass conn=<the transaction> instead of opening another one"
            )
        async with self._lock:
            self._holder = task
            try:
                yield
            finally:
                self._holder = None

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in one ``BEGIN IMMEDIATE`` transaction, in one hop to the thread.

        While nobody holds the writer, the hop is queued without taking the lock: the thread
        runs calls in submission order, so this whole transaction (``BEGIN`` to ``COMMIT`` in
        one call) runs before the ``BEGIN`` of any transaction whose holder takes the lock
        after it. While a transaction is open (its statements span awaits), the write waits
        for the lock as before, and a task writing inside its own transaction is refused.
        """
        if self._lock.locked():
            async with self.locked():
                return await self.op(self._in_tx, fn)
        return await self.op(self._in_tx, fn)

    def _in_tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self.writer()
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(conn)
            conn.execute("COMMIT")
        except BaseException:
            self._rollback_sync()
            raise
        return result

    def _rollback_sync(self) -> None:
        conn = self._writer
        if conn is not None and conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                logger.exception("jobs.sqlite.rollback_failed path=%s", self.path)

    async def _rollback(self) -> None:
        # Queued behind whatever still runs on the thread (FIFO), so it cannot be overtaken;
        # shielded so a second cancellation cannot leave the transaction open.
        await asyncio.shield(self.call(self._rollback_sync))

    @asynccontextmanager
    async def begin(self, check: tuple[int, int] | None = None) -> AsyncIterator[SQLiteTransaction]:
        """An open ``BEGIN IMMEDIATE`` transaction; with ``check``, only while that lease holds.

        The body commits (``await db.op(db.commit_sync)`` or its own fenced finish); any
        exception rolls back.
        """
        async with self.locked():
            try:
                held = await self.op(self._begin_sync, check)
            except BaseException:
                await self._rollback()
                raise
            if not held:
                job_id, fence = check or (0, 0)
                raise LeaseLostError(detail=f"job {job_id} is no longer leased at fence {fence}")
            tx = SQLiteTransaction(self)
            try:
                yield tx
            except BaseException:
                tx._end(committed=False)
                await self._rollback()
                raise

    def _begin_sync(self, check: tuple[int, int] | None) -> bool:
        conn = self.writer()
        conn.execute("BEGIN IMMEDIATE")
        if check is not None and conn.execute(q.HELD, check).fetchone() is None:
            conn.execute("ROLLBACK")
            return False
        return True

    def commit_sync(self) -> None:
        self.writer().execute("COMMIT")
