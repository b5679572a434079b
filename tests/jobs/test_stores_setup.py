"""Store setup: schema creation and migration, misuse errors, the lazy PostgreSQL import."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from forgezero_lifecycle._errors import JobStoreError
from forgezero_lifecycle.jobs import SQLiteJobStore
from forgezero_lifecycle.jobs.postgres import PostgresJobStore

pytestmark = pytest.mark.anyio


async def test_sqlite_schema_created_once(tmp_path: Path) -> None:
    """Opening twice (two generations) migrates once and keeps the data; WAL is on."""
    path = tmp_path / "jobs.db"
    async with SQLiteJobStore(path) as first:
        job = await first.enqueue("q", {"n": 1})
        async with SQLiteJobStore(path) as second:
            assert await second.get(job.id) == job
    with sqlite3.connect(path) as conn:
        versions = conn.execute("SELECT version FROM forgezero_jobs_schema_version").fetchall()
        mode = conn.execute("PRAGMA journal_mode").fetchone()
    conn.close()
    assert versions == [(1,)]
    assert mode == ("wal",)


async def test_sqlite_refuses_newer(tmp_path: Path) -> None:
    """A database migrated by a newer library version is refused with JOB_STORE_SCHEMA."""
    path = tmp_path / "jobs.db"
    async with SQLiteJobStore(path):
        pass
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO forgezero_jobs_schema_version (version) VALUES (99)")
    conn.close()
    store = SQLiteJobStore(path)
    with pytest.raises(JobStoreError) as caught:
        await store.open()
    assert caught.value.code == "JOB_STORE_SCHEMA"


async def test_sqlite_misuse_is_reported(tmp_path: Path) -> None:
    """In-memory paths, use before open and a nested transaction give clear errors."""
    with pytest.raises(ValueError, match="file"):
        SQLiteJobStore(":memory:")
    store = SQLiteJobStore(tmp_path / "jobs.db")
    with pytest.raises(JobStoreError, match="open"):
        await store.enqueue("q", {})
    async with store:
        async with store.transaction() as tx:
            with pytest.raises(RuntimeError, match="conn="):
                await store.enqueue("q", {})
            await store.enqueue("q", {}, conn=tx)
        with pytest.raises(RuntimeError, match="ended"):
            await tx.execute("SELECT 1")
        assert (await store.statistics()).queued == 1


async def test_sqlite_writers_wait(tmp_path: Path) -> None:
    """busy_timeout makes a write wait for another process's write lock instead of failing."""
    path = tmp_path / "jobs.db"
    async with SQLiteJobStore(path, busy_timeout=5.0) as store:
        holder = _hold_write_lock(path, seconds=0.5)
        try:
            assert holder.stdout is not None
            assert await anyio.to_thread.run_sync(holder.stdout.readline) == "locked\n"
            job = await store.enqueue("q", {})  # waits for the other process's COMMIT
            assert (await store.get(job.id)) == job
        finally:
            holder.wait(10)
            assert holder.stdout is not None
            holder.stdout.close()


def _hold_write_lock(path: Path, seconds: float) -> subprocess.Popen[str]:
    """Another process that takes the database's write lock, says so, and commits later."""
    script = (
        "import sqlite3, time\n"
        f"c = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE'); print('locked', flush=True)\n"
        f"time.sleep({seconds}); c.execute('COMMIT')\n"
    )
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


@pytest.mark.postgres
async def test_postgres_concurrent_migrate(pg_dsn: str, pg_schema: str) -> None:
    """Two stores migrating the same schema at once end with one version row."""
    stores = [PostgresJobStore(pg_dsn, schema=pg_schema, max_size=1) for _ in range(3)]
    try:
        async with anyio.create_task_group() as tg:
            for store in stores:
                tg.start_soon(store.open)
        job = await stores[0].enqueue("q", {})
        assert await stores[2].get(job.id) == job
    finally:
        for store in stores:
            await store.close()
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        cur = await conn.execute(f'SELECT version FROM "{pg_schema}".schema_version')
        assert await cur.fetchall() == [(1,)]


@pytest.mark.postgres
async def test_postgres_refuses_newer(pg_dsn: str, pg_schema: str) -> None:
    """A schema at a newer version than the library knows is refused."""
    async with PostgresJobStore(pg_dsn, schema=pg_schema):
        pass
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(f'INSERT INTO "{pg_schema}".schema_version (version) VALUES (99)')
    store = PostgresJobStore(pg_dsn, schema=pg_schema)
    try:
        with pytest.raises(JobStoreError) as caught:
            await store.open()
        assert caught.value.code == "JOB_STORE_SCHEMA"
    finally:
        await store.close()


@pytest.mark.postgres
async def test_postgres_skips_closed_conn(pg_dsn: str, pg_schema: str) -> None:
    """After the server ends a pooled connection (a restart does it to all), enqueue still works."""
    async with PostgresJobStore(pg_dsn, schema=pg_schema, min_size=1, max_size=1) as store:
        async with store.transaction() as conn:
            row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
        assert row is not None
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (row[0],))
            gone = "SELECT 1 FROM pg_stat_activity WHERE pid = %s"
            with anyio.fail_after(5):  # the server offers no event for a backend's exit
                while await (await admin.execute(gone, (row[0],))).fetchone():  # noqa: ASYNC110 - polled: see above
                    await anyio.sleep(0.01)
        await anyio.sleep(0.05)  # the end of file crosses loopback
        job = await store.enqueue("q", {"after": "terminate"})
        assert await store.get(job.id) == job


@pytest.mark.postgres
async def test_postgres_pool_exhausted(pg_dsn: str, pg_schema: str) -> None:
    """A pool with no connection to give within its timeout fails enqueue with JobStoreError."""
    from psycopg_pool import AsyncConnectionPool

    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        pg_dsn, min_size=1, max_size=1, timeout=0.2, open=False, kwargs={"autocommit": True}
    )
    await pool.open(wait=True)
    try:
        async with PostgresJobStore(pool=pool, schema=pg_schema) as store:
            held = await pool.getconn()  # the pool's only connection
            try:
                with pytest.raises(JobStoreError, match="PoolTimeout"):
                    await store.enqueue("q", {"n": 1})
                with pytest.raises(JobStoreError, match="PoolTimeout"):
                    await _open_transaction(store)
            finally:
                await pool.putconn(held)
            job = await store.enqueue("q", {"n": 2})  # and the store works again
            assert await store.get(job.id) == job
    finally:
        await pool.close()


async def _open_transaction(store: PostgresJobStore) -> None:
    async with store.transaction():
        pass


def test_postgres_bad_arguments() -> None:
    """A schema name must be a plain identifier; exactly one of dsn and pool."""
    for bad in ("", "1abc", "a-b", 'x"; DROP TABLE y; --', "a" * 64):
        with pytest.raises(ValueError, match="schema"):
            PostgresJobStore("postgresql://localhost/x", schema=bad)
    with pytest.raises(ValueError, match="exactly one"):
        PostgresJobStore()


def test_missing_psycopg_hint() -> None:
    """Without psycopg the package imports, and PostgresJobStore names the extra to install."""
    code = (
        "import sys\n"
        "sys.modules['psycopg'] = None\n"
        "import forgezero_lifecycle.jobs as jobs\n"
        "try:\n"
        "    jobs.PostgresJobStore\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert "pip install 'forgezero-lifecycle[postgres]'" in out.stdout
