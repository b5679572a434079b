"""Two generations as real processes on one database: nothing lost, nothing done twice."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from forgezero_lifecycle._errors import LeaseLostError
from forgezero_lifecycle.jobs import JobStatistics, Lease, SQLiteJobStore
from forgezero_lifecycle.jobs.postgres import PostgresJobStore

from .conftest import postgres_dsn

# Several worker processes share one store: real processes, as the `server` tests start.
pytestmark = [pytest.mark.anyio, pytest.mark.server]

SCRIPT = Path(__file__).with_name("proc_worker.py")


class Proc:
    """A worker process whose stdout lines are collected by a reader thread."""

    def __init__(self, args: list[str]) -> None:
        self.lines: list[str] = []
        self.popen = subprocess.Popen(
            [sys.executable, str(SCRIPT), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))

    def starting(self, prefix: str) -> list[str]:
        return [line for line in self.lines if line.startswith(prefix)]

    async def wait_line(self, prefix: str, count: int = 1, seconds: float = 20.0) -> list[str]:
        with anyio.fail_after(seconds):
            while len(self.starting(prefix)) < count:
                if self.popen.poll() is not None:
                    await anyio.sleep(0.1)
                    if len(self.starting(prefix)) < count:
                        raise AssertionError(f"worker exited: {self.lines[-20:]}")
                await anyio.sleep(0.02)
        return self.starting(prefix)

    def release(self) -> None:
        """A line on the worker's stdin: handlers held by ``--hold`` go on."""
        assert self.popen.stdin is not None
        self.popen.stdin.write("go\n")
        self.popen.stdin.flush()

    async def finish(self, sig: signal.Signals, seconds: float = 20.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        with anyio.fail_after(seconds):
            while self.popen.poll() is None:  # noqa: ASYNC110 - another process's state
                await anyio.sleep(0.02)
        return self.close()

    def close(self) -> int:
        if self.popen.poll() is None:
            self.popen.kill()
        code = self.popen.wait()
        self._reader.join(5)
        assert self.popen.stdin is not None
        assert self.popen.stdout is not None
        self.popen.stdin.close()
        self.popen.stdout.close()
        return code


class Shared:
    """A database two processes share: the parent's store handle and the child arguments."""

    def __init__(self, store: Any, args: list[str], results: Callable[[], Any]) -> None:
        self.store = store
        self.args = args
        self.results = results
        self.procs: list[Proc] = []

    def spawn(self, owner: str, mode: str, *extra: str) -> Proc:
        proc = Proc([*self.args, "--owner", owner, "--mode", mode, *extra])
        self.procs.append(proc)
        return proc

    async def wait_done(self, total: int, seconds: float) -> None:
        with anyio.fail_after(seconds):
            while await self.store.statistics() != JobStatistics(done=total):  # noqa: ASYNC110 - database state
                await anyio.sleep(0.05)


@pytest.fixture(
    params=[pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def shared(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Shared]:
    store: Any
    if request.param == "sqlite":
        path = tmp_path / "shared.db"
        store = SQLiteJobStore(path)
        await store.open()
        async with store.transaction() as tx:
            await tx.execute("CREATE TABLE app_results (job_id INTEGER NOT NULL, owner TEXT)")

        async def results() -> list[tuple[int, str]]:
            with sqlite3.connect(path) as conn:
                rows = conn.execute("SELECT job_id, owner FROM app_results").fetchall()
            conn.close()
            return rows

        made = Shared(store, ["--store", "sqlite", "--target", str(path)], results)
    else:
        dsn = postgres_dsn()
        schema = request.getfixturevalue("pg_schema")
        store = PostgresJobStore(dsn, schema=schema, max_size=4)
        await store.open()
        async with store.transaction() as conn:
            await conn.execute(f'CREATE TABLE "{schema}".app_results (job_id bigint, owner text)')

        async def results() -> list[tuple[int, str]]:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                cur = await conn.execute(f'SELECT job_id, owner FROM "{schema}".app_results')
                return await cur.fetchall()

        args = ["--store", "postgres", "--target", dsn, "--schema", schema]
        made = Shared(store, args, results)
    try:
        yield made
    finally:
        for proc in made.procs:
            proc.close()
        await store.close()


async def enqueue_all(store: Any, count: int) -> None:
    async with store.transaction() as conn:
        for i in range(count):
            await store.enqueue("q", {"i": i}, idempotency_key=f"job-{i}", conn=conn)


async def test_two_processes_share_db(shared: Shared) -> None:
    """Two processes burn down one queue: every job completes exactly once.

    Each process's handlers are held until both have claimed a job, so both take part however
    the machine schedules them (without it, one fast process sometimes did it all).
    """
    total = 300
    workers = [
        shared.spawn(f"gen-{n}", "work", "--lease", "2", "--work-ms", "20", "--hold")
        for n in range(2)
    ]
    for proc in workers:
        await proc.wait_line("READY")
    await enqueue_all(shared.store, total)
    for proc in workers:
        await proc.wait_line("CLAIMED")
    for proc in workers:
        proc.release()
    await shared.wait_done(total, seconds=40)
    for proc in workers:
        assert await proc.finish(signal.SIGTERM) == 0
    rows = await shared.results()
    assert len(rows) == total
    assert sorted(job_id for job_id, _ in rows) == sorted({job_id for job_id, _ in rows})
    assert {owner for _, owner in rows} == {"gen-0", "gen-1"}


async def test_killed_generation_reclaimed(
    shared: Shared,
) -> None:
    """SIGKILL mid-job: the new generation reclaims after the lease; the old lease is dead."""
    old = shared.spawn("old", "hang", "--lease", "1", "--concurrency", "4")
    await old.wait_line("READY")
    await enqueue_all(shared.store, 4)
    started = await old.wait_line("STARTED", count=4)
    stale = {int(line.split()[1]): int(line.split()[2]) for line in started}
    assert await old.finish(signal.SIGKILL) == -signal.SIGKILL
    new = shared.spawn("new", "work", "--lease", "1")
    await new.wait_line("READY")
    await shared.wait_done(4, seconds=20)
    assert sorted(await shared.results()) == sorted((job_id, "new") for job_id in stale)
    for job_id, fence in stale.items():
        job = await shared.store.get(job_id)
        assert job is not None
        assert (job.attempts, job.fence) == (2, fence + 1)
        late: Lease[Any] = Lease(shared.store, job, fence=fence, owner="old")
        with pytest.raises(LeaseLostError):
            async with late.commit() as conn:
                await conn.execute(*_insert(shared, job_id))
    assert len(await shared.results()) == 4
    assert await new.finish(signal.SIGTERM) == 0


def _insert(shared: Shared, job_id: int) -> tuple[str, tuple[int, str]]:
    if isinstance(shared.store, SQLiteJobStore):
        return "INSERT INTO app_results (job_id, owner) VALUES (?, ?)", (job_id, "old")
    schema = shared.store.schema
    return f'INSERT INTO "{schema}".app_results (job_id, owner) VALUES (%s, %s)', (job_id, "old")


async def test_drained_generation_releases(shared: Shared) -> None:
    """A drained old process releases its jobs; the new one claims them long before expiry."""
    old = shared.spawn("old", "hang", "--lease", "30", "--concurrency", "4")
    await old.wait_line("READY")
    await enqueue_all(shared.store, 4)
    await old.wait_line("STARTED", count=4)
    assert await old.finish(signal.SIGTERM) == 0
    assert old.starting("DRAINED") == ["DRAINED released=4"]
    assert await shared.store.statistics() == JobStatistics(queued=4)
    new = shared.spawn("new", "work", "--lease", "30")
    await shared.wait_done(4, seconds=10)  # far below the 30 s lease
    rows = await shared.results()
    assert sorted(owner for _, owner in rows) == ["new"] * 4
    for job_id, _ in rows:
        job = await shared.store.get(job_id)
        assert job is not None
        assert (job.attempts, job.fence) == (1, 2)
    assert await new.finish(signal.SIGTERM) == 0
