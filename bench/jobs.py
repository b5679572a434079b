"""Durable job throughput on SQLite and PostgreSQL, next to plain SQL loops on the same database.

* **burn-down**: ``N`` no-op jobs are enqueued up front; a :class:`JobWorker` at concurrency 1,
  8 and 32 claims, runs and completes them (fenced) until all are ``done``. Baseline: a plain
  loop of ``UPDATE ... SET state = 'done' WHERE id = ?``, one transaction per row.
* **enqueue**: ``store.enqueue`` one job per transaction. Baseline: a plain ``INSERT``, one
  transaction per row. The two alternate **one operation at a time** (baseline, ours, ours,
  baseline, ...) and each side sums its own time, so a slow fsync or a busy neighbour hits
  both alike; the ratio is taken per repeat and its median reported. Target: at least 0.7.
  A third side in the same rotation runs the store's own ``INSERT`` as plain SQL on the store's
  schema: its ratio (in the row's note) is what the row costs before any library code runs.
  On SQLite the baseline's statements run **on the event loop's thread** (blocking it for the
  commit's fsync, which a library must not do), while the store hops to its statement thread
  and back for every transaction; so a fourth side runs the baseline's own statements through
  one such hop (:class:`~forgezero_lifecycle.jobs._sqlite_db.StatementThread`, no library code):
  its ratio, in the note, is the price of keeping SQLite's I/O off the loop. The ratio itself
  still compares against the on-loop baseline. Every side pays the same commit (fsync); the
  hop, the row's indexes and the library's CPU are a roughly fixed cost on top, so the ratio
  falls when the disk's commits get fast (and rises when a neighbour makes them slow).
  The note also gives each side's CPU time on the loop's thread per operation (enqueue minus
  the plain statement's side is the library's own work) and, on SQLite, the floor of any hop on
  the host: a :class:`StatementThread` call that runs nothing, and two plain threads handing an
  item back and forth through :class:`queue.SimpleQueue` (no asyncio, no library code).
* **enqueue_many**: ``store.enqueue_many`` of 10,000 jobs (one transaction). Baseline: the same
  rows as one plain multi-row insert in one transaction (``executemany`` on SQLite, one
  ``INSERT ... SELECT FROM unnest`` on PostgreSQL).

The enqueue rows run the store as an application gets it (the default pool on PostgreSQL) and
interleave each repeat with its baseline, so machine noise hits both alike.

Both stores run with their durable defaults (SQLite WAL + ``synchronous=FULL``; PostgreSQL with
the server's ``synchronous_commit``); the baselines use the same settings. PostgreSQL rows need a
DSN in ``FORGEZERO_BENCH_POSTGRES_DSN`` (or ``FORGEZERO_TEST_POSTGRES_DSN``, or
``--postgres-dsn``) and are left out without one. Each repeat uses a fresh database (SQLite
file, PostgreSQL schema). Run ``python -m bench.jobs [--quick] [--enqueue-only]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from bench._report import not_run, paired, print_table, row
from forgezero_lifecycle.jobs import JobWorker, Lease, SQLiteJobStore

__all__ = ["run"]

CONCURRENCY = (1, 8, 32)
BATCH = 10_000
ENQUEUE_TARGET = 0.7
NOTE = (
    "baseline: a plain {statement} loop, one transaction per row, on the same database with the "
    "same durability settings; {repeats} repeats, each on a fresh database"
)


def _target(store: str, concurrency: int) -> float | None:
    """The issue's throughput targets (2-core machine), at concurrency 32 only."""
    if concurrency != 32:
        return None
    return 2_000.0 if store == "sqlite" else 3_000.0


# -- stores ----------------------------------------------------------------------------------


@asynccontextmanager
async def _sqlite_store(workdir: Path) -> AsyncIterator[Any]:
    store = SQLiteJobStore(workdir / f"jobs-{uuid.uuid4().hex[:8]}.db")
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def _postgres_factory(dsn: str, **pool: int) -> Callable[[Path], Any]:
    """Stores on fresh schemas; ``pool`` sizes default to the store's own defaults."""

    @asynccontextmanager
    async def factory(workdir: Path) -> AsyncIterator[Any]:
        import psycopg

        from forgezero_lifecycle.jobs.postgres import PostgresJobStore

        schema = f"fz_bench_{uuid.uuid4().hex[:10]}"
        store = PostgresJobStore(dsn, schema=schema, **pool)
        await store.open()
        try:
            yield store
        finally:
            await store.close()
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    return factory


# -- our side --------------------------------------------------------------------------------


async def _burn_down(factory: Any, workdir: Path, jobs: int, concurrency: int) -> float:
    async with factory(workdir) as store:
        async with store.transaction() as conn:
            for i in range(jobs):
                await store.enqueue("noop", {"i": i}, conn=conn)
        worker = JobWorker(store, concurrency=concurrency, lease=30.0, idle_interval=0.01)

        @worker.handler("noop")
        async def noop(lease: Lease[Any]) -> None:
            return None

        started = time.perf_counter()
        worker.start()
        while worker.statistics().completed < jobs:  # noqa: ASYNC110 - no completion hook
            await asyncio.sleep(0.002)
        elapsed = time.perf_counter() - started
        await worker.stop(timeout=1.0)
        stats = await store.statistics()
        if stats.done != jobs:
            raise RuntimeError(f"burn-down ended with {stats}, expected {jobs} done")
        return jobs / elapsed


async def _alternate(
    sides: list[Callable[[int], Awaitable[Any]]], jobs: int
) -> tuple[list[float], list[float]]:
    """Jobs/s of each side, one operation of each in turn (the order rotating every round), and
    each side's CPU time on the loop's thread per operation, in µs."""
    clock, cpu = time.perf_counter, time.thread_time
    spent = [0.0] * len(sides)
    used = [0.0] * len(sides)
    for i in range(jobs):
        for k in range(len(sides)):
            side = (i + k) % len(sides)
            started, began = clock(), cpu()
            await sides[side](i)
            spent[side] += clock() - started
            used[side] += cpu() - began
    return [jobs / seconds for seconds in spent], [seconds / jobs * 1e6 for seconds in used]


async def _enqueue_paired(
    factory: Any, workdir: Path, inserters: Sequence[Callable[[], Any]], jobs: int
) -> tuple[list[float], list[float]]:
    """Jobs/s (and loop-thread CPU µs per operation) of ``store.enqueue`` and of each inserter
    (the plain insert, the store's own INSERT as plain SQL, on SQLite the plain insert through
    one thread hop), in rotation."""
    async with factory(workdir) as store, AsyncExitStack() as stack:
        sides = [await stack.enter_async_context(inserter()) for inserter in inserters]

        async def enqueue(i: int) -> None:
            await store.enqueue("noop", {"i": i})

        return await _alternate([enqueue, *sides], jobs)


async def _enqueue_many(factory: Any, workdir: Path, jobs: int) -> float:
    async with factory(workdir) as store:
        payloads = [{"i": i} for i in range(jobs)]
        keys = [f"batch:{i}" for i in range(jobs)]
        started = time.perf_counter()
        made = await store.enqueue_many("noop", payloads, idempotency_keys=keys)
        elapsed = time.perf_counter() - started
        if len(made) != jobs or (await store.statistics()).queued != jobs:
            raise RuntimeError(f"enqueue_many made {len(made)} jobs, expected {jobs}")
        return jobs / elapsed


# -- baselines: plain statements, one transaction each ---------------------------------------


@contextmanager
def _sqlite_file(
    workdir: Path, table: bool = True, any_thread: bool = False
) -> Iterator[sqlite3.Connection]:
    """A fresh SQLite file with the store's durability settings (WAL, ``synchronous=FULL``)
    and, with ``table``, the plain table ``t``; closed afterwards. ``any_thread``: usable from
    a thread other than this one (one at a time)."""
    path = workdir / f"plain-{uuid.uuid4().hex[:8]}.db"
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=not any_thread)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        if table:
            conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT, state TEXT)")
        yield conn
    finally:
        conn.close()


def _sqlite_baseline(workdir: Path, rows: int, kind: str) -> float:
    with _sqlite_file(workdir) as conn:
        if kind == "update":
            conn.execute("BEGIN")
            conn.executemany(
                "INSERT INTO t (id, payload, state) VALUES (?, '{}', 'queued')",
                ((i,) for i in range(rows)),
            )
            conn.execute("COMMIT")
        started = time.perf_counter()
        if kind == "batch":
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO t (payload, state) VALUES (?, 'queued')",
                ((f'{{"i":{i}}}',) for i in range(rows)),
            )
            conn.execute("COMMIT")
            return rows / (time.perf_counter() - started)
        for i in range(rows):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE t SET state = 'done' WHERE id = ?", (i,))
            conn.execute("COMMIT")
        return rows / (time.perf_counter() - started)


@asynccontextmanager
async def _sqlite_inserter(
    workdir: Path, own_sql: bool = False
) -> AsyncIterator[Callable[[int], Any]]:
    """A one-row-per-transaction insert on a fresh SQLite file (same settings), on the loop's
    thread: into the plain table, or with ``own_sql`` the store's own INSERT on its schema."""
    from forgezero_lifecycle.jobs import _sqlite_sql

    with _sqlite_file(workdir, table=not own_sql) as conn:
        if own_sql:
            _sqlite_sql.migrate(conn)

        def row(i: int) -> tuple[Any, ...]:
            return _own_row(i) if own_sql else (f'{{"i":{i}}}',)

        statement = (
            _sqlite_sql.INSERT if own_sql else "INSERT INTO t (payload, state) VALUES (?, 'queued')"
        )

        async def insert(i: int) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(statement, row(i)).fetchall()
            conn.execute("COMMIT")

        yield insert


def _insert_sync(conn: sqlite3.Connection, i: int) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO t (payload, state) VALUES (?, 'queued')", (f'{{"i":{i}}}',))
    conn.execute("COMMIT")


@asynccontextmanager
async def _sqlite_hop_inserter(workdir: Path) -> AsyncIterator[Callable[[int], Any]]:
    """The plain insert (same statements, same settings) run off the loop in one hop to a
    :class:`StatementThread` and back, as the store does it, with no library code."""
    from forgezero_lifecycle.jobs._sqlite_db import StatementThread

    thread = StatementThread("fz-bench-hop")
    try:
        with _sqlite_file(workdir, any_thread=True) as conn:

            async def insert(i: int) -> None:
                await thread.submit(_insert_sync, conn, i)

            yield insert
    finally:
        thread.stop()


def _noop() -> None:
    return None


def _echo(calls: queue.SimpleQueue[int | None], answers: queue.SimpleQueue[int]) -> None:
    while (item := calls.get()) is not None:
        answers.put(item)


async def _hop_floor(hops: int = 2_000) -> tuple[float, float]:
    """µs per hop of a :class:`StatementThread` call that runs nothing, and per round trip of
    two plain threads handing an item back and forth through :class:`queue.SimpleQueue` (no
    asyncio, no library code): what waking a waiting thread costs on this host, twice."""
    from forgezero_lifecycle.jobs._sqlite_db import StatementThread

    thread = StatementThread("fz-bench-hop-floor")
    try:
        started = time.perf_counter()
        for _ in range(hops):
            await thread.submit(_noop)
        hop = (time.perf_counter() - started) / hops * 1e6
    finally:
        thread.stop()
    calls: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    answers: queue.SimpleQueue[int] = queue.SimpleQueue()
    echo = threading.Thread(target=_echo, args=(calls, answers), daemon=True)
    echo.start()
    started = time.perf_counter()
    for i in range(hops):
        calls.put(i)
        answers.get()
    plain = (time.perf_counter() - started) / hops * 1e6
    calls.put(None)
    echo.join()
    return hop, plain


def _postgres_inserter(dsn: str) -> Callable[[], Any]:
    """A plain one-row-per-transaction insert (autocommit, prepared) on a fresh table."""

    @asynccontextmanager
    async def inserter() -> AsyncIterator[Callable[[int], Any]]:
        import psycopg

        table = f"fz_bench_baseline_{uuid.uuid4().hex[:10]}"
        statement = f"INSERT INTO {table} VALUES (%s, %s::jsonb, 'queued')"
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                f"CREATE TABLE {table} (id bigint PRIMARY KEY, payload jsonb, state text)"
            )

            async def insert(i: int) -> None:
                await conn.execute(statement, (i, f'{{"i":{i}}}'), prepare=True)

            try:
                yield insert
            finally:
                await conn.execute(f"DROP TABLE {table}")

    return inserter


def _own_row(i: int) -> tuple[Any, ...]:
    """The arguments the SQLite store's INSERT gets for job ``i`` (a new key every time)."""
    now = time.time()
    return ("noop", f'{{"i":{i}}}', "0" * 64, f"auto:{uuid.uuid4().hex}", 5, now, now, now)


def _postgres_own_sql(dsn: str) -> Callable[[], Any]:
    """The PostgreSQL store's own INSERT on a fresh store schema, on one plain connection."""

    @asynccontextmanager
    async def inserter() -> AsyncIterator[Callable[[int], Any]]:
        import psycopg

        from forgezero_lifecycle.jobs.postgres import PostgresJobStore

        schema = f"fz_bench_{uuid.uuid4().hex[:10]}"
        store = PostgresJobStore(dsn, schema=schema, min_size=1, max_size=1)
        await store.open()
        await store.close()
        statement = store._q.insert
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:

            async def insert(i: int) -> None:
                args = ("noop", f'{{"i":{i}}}', "0" * 64, f"auto:{uuid.uuid4().hex}", 5, 0.0)
                await (await conn.execute(statement, args, prepare=True)).fetchone()

            try:
                yield insert
            finally:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    return inserter


async def _postgres_baseline(dsn: str, rows: int, kind: str) -> float:
    import psycopg

    table = f"fz_bench_baseline_{uuid.uuid4().hex[:10]}"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, payload jsonb, state text)"
        )
        try:
            if kind == "update":
                async with conn.cursor() as cur:
                    await cur.executemany(
                        f"INSERT INTO {table} VALUES (%s, '{{}}', 'queued')",
                        [(i,) for i in range(rows)],
                    )
            started = time.perf_counter()
            if kind == "batch":
                await conn.execute(
                    f"INSERT INTO {table} SELECT n, payload::jsonb, 'queued'"
                    " FROM unnest(%s::bigint[], %s::text[]) AS t(n, payload)",
                    (list(range(rows)), [f'{{"i":{i}}}' for i in range(rows)]),
                )
                return rows / (time.perf_counter() - started)
            for i in range(rows):
                await conn.execute(
                    f"UPDATE {table} SET state = 'done' WHERE id = %s", (i,), prepare=True
                )
            return rows / (time.perf_counter() - started)
        finally:
            await conn.execute(f"DROP TABLE {table}")


# -- driver ----------------------------------------------------------------------------------


def _row(
    name: str,
    rates: list[float],
    baselines: list[float],
    target: float | None,
    command: str,
    note: str = "",
) -> dict[str, object]:
    median = statistics.median(rates)
    baseline = statistics.median(baselines)
    return row(
        name,
        "throughput",
        "jobs/s",
        [round(rate) for rate in rates],
        baseline=round(baseline),
        ratio=round(median / baseline, 3),
        target="—" if target is None else f"≥ {target:,.0f} jobs/s",
        command=command,
        ok=None if target is None else median >= target,
        note=note,
    )


async def _bench_store(
    name: str,
    factories: tuple[Any, Any],
    baselines: tuple[Callable[[int, str], Any], *tuple[Callable[[], Any], ...]],
    quick: bool,
    command: str,
    enqueue_only: bool = False,
) -> list[dict[str, object]]:
    """Burn-down rows (``factories[0]``: a pool sized for concurrency) and enqueue rows
    (``factories[1]``: the store as an application opens it). ``baselines``: the plain
    statement loops, then the one-row inserters the enqueue alternates with (the plain insert,
    the store's own INSERT as plain SQL and, optionally, the plain insert through a thread
    hop)."""
    jobs, repeats = (1_000, 3) if quick else (5_000, 5)
    enqueue_jobs = 300 if quick else 2_000
    baseline, *inserters = baselines
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="fz-bench-jobs-") as tmp:
        workdir = Path(tmp)
        if not enqueue_only:
            rows += await _burn_downs(name, factories[0], baseline, jobs, repeats, command, workdir)
        factory = factories[1]
        rounds, cpus, floors = [], [], []
        for _ in range(repeats):
            rates, used = await _enqueue_paired(factory, workdir, inserters, enqueue_jobs)
            rounds.append(rates)
            cpus.append(used)
            if len(inserters) > 2:
                floors.append(await _hop_floor())
        rates = [sides[0] for sides in rounds]
        bases = [sides[1] for sides in rounds]
        ratios = paired(rates, bases)
        schema_ratios = paired([sides[2] for sides in rounds], bases)
        enqueued = _row(f"jobs.{name} enqueue, {enqueue_jobs:,} jobs", rates, bases, None, command)
        cpu = [statistics.median(used[k] for used in cpus) for k in range(len(inserters) + 1)]
        note = (
            "baseline: a plain INSERT, one transaction per row, on the same database with the "
            "same durability settings, alternating with each enqueue; ratio: median of "
            f"{repeats} per-repeat ratios ({_spread(ratios)}), each repeat on a fresh database. "
            "The store's own INSERT run as plain SQL on its schema, in the same rotation: "
            f"{statistics.median(schema_ratios):.2f} of the baseline ({_spread(schema_ratios)}),"
            " the part of the gap that is the row itself (its indexes), not the library"
        )
        if len(inserters) > 2:
            hop_ratios = paired([sides[3] for sides in rounds], bases)
            hop, plain = (statistics.median(floor[k] for floor in floors) for k in (0, 1))
            note += (
                ". The baseline runs on the event loop's thread; the same plain INSERT through"
                " one hop to a statement thread and back (as the store keeps SQLite's I/O off"
                f" the loop), in the same rotation: {statistics.median(hop_ratios):.2f} of the"
                f" baseline ({_spread(hop_ratios)}), the price of that hop alone. A hop that runs"
                f" nothing takes {hop:.0f} µs, and two plain threads handing an item back and"
                f" forth (queue.SimpleQueue, no asyncio) {plain:.0f} µs per round trip: the"
                " host's cost of waking a thread that waits on another CPU, twice per hop."
                f" CPU on the loop's thread per operation: enqueue {cpu[0]:.0f} µs, the plain"
                f" INSERT through the hop {cpu[3]:.0f} µs (its statements run on the thread),"
                " the difference being the library's own work"
            )
        else:
            note += (
                f". CPU on the loop's thread per operation: enqueue {cpu[0]:.0f} µs, the store's"
                f" own INSERT as plain SQL {cpu[2]:.0f} µs, the plain INSERT {cpu[1]:.0f} µs; the"
                " first difference is the library's own work"
            )
        ratio = statistics.median(ratios)
        enqueued.update(
            ratio=round(ratio, 3),
            target=f"ratio ≥ {ENQUEUE_TARGET}",
            note=note,
            ok=ratio >= ENQUEUE_TARGET,
        )
        rows.append(enqueued)
        batches: list[float] = []
        rates = []
        for _ in range(repeats):
            batches.append(await baseline(BATCH, "batch"))
            rates.append(await _enqueue_many(factory, workdir, BATCH))
        note = (
            f"baseline: the same {BATCH:,} rows as one plain multi-row insert in one "
            f"transaction; {repeats} repeats, interleaved, each on a fresh database"
        )
        rows.append(
            _row(f"jobs.{name} enqueue_many, {BATCH:,} jobs", rates, batches, None, command, note)
        )
    return rows


def _spread(ratios: list[float]) -> str:
    return f"spread {min(ratios):.2f} to {max(ratios):.2f}"


async def _burn_downs(
    name: str,
    factory: Any,
    baseline: Callable[[int, str], Any],
    jobs: int,
    repeats: int,
    command: str,
    workdir: Path,
) -> list[dict[str, object]]:
    rows = []
    updates = [await baseline(jobs, "update") for _ in range(repeats)]
    for concurrency in CONCURRENCY:
        rates = [await _burn_down(factory, workdir, jobs, concurrency) for _ in range(repeats)]
        rows.append(
            _row(
                f"jobs.{name} burn-down, concurrency {concurrency}, {jobs:,} jobs",
                rates,
                updates,
                _target(name, concurrency),
                command,
                NOTE.format(statement="UPDATE", repeats=repeats) if concurrency == 1 else "",
            )
        )
    return rows


async def _run(quick: bool, dsn: str | None, enqueue_only: bool = False) -> list[dict[str, object]]:
    command = ".venv/bin/python -m bench.jobs" + (" --quick" if quick else "")
    with tempfile.TemporaryDirectory(prefix="fz-bench-base-") as tmp:
        base = Path(tmp)

        async def sqlite_baseline(rows: int, kind: str) -> float:
            return _sqlite_baseline(base, rows, kind)

        sqlite = (_sqlite_store, _sqlite_store)
        plain = (
            sqlite_baseline,
            lambda: _sqlite_inserter(base),
            lambda: _sqlite_inserter(base, own_sql=True),
            lambda: _sqlite_hop_inserter(base),
        )
        out = await _bench_store("sqlite", sqlite, plain, quick, command, enqueue_only)
    if dsn:

        async def pg_baseline(rows: int, kind: str) -> float:
            return await _postgres_baseline(dsn, rows, kind)

        postgres = (_postgres_factory(dsn, min_size=4, max_size=8), _postgres_factory(dsn))
        pg_plain = (pg_baseline, _postgres_inserter(dsn), _postgres_own_sql(dsn))
        out += await _bench_store("postgres", postgres, pg_plain, quick, command, enqueue_only)
    else:
        reason = "no PostgreSQL: set FORGEZERO_BENCH_POSTGRES_DSN (make bench sets a default)"
        out.append(not_run("jobs.postgres (every row)", reason, command))
    return out


def _dsn(explicit: str | None = None) -> str | None:
    return (
        explicit
        or os.environ.get("FORGEZERO_BENCH_POSTGRES_DSN")
        or os.environ.get("FORGEZERO_TEST_POSTGRES_DSN")
    )


def run(quick: bool) -> list[dict[str, object]]:
    """Measure and return one row per store and scenario (PostgreSQL only with a DSN)."""
    return asyncio.run(_run(quick, _dsn()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="1,000 jobs x 3 repeats")
    parser.add_argument("--postgres-dsn", help="PostgreSQL to benchmark (default: from env)")
    parser.add_argument("--enqueue-only", action="store_true", help="skip the burn-down rows")
    args = parser.parse_args(argv)
    dsn = _dsn(args.postgres_dsn)
    print_table(asyncio.run(_run(args.quick, dsn, args.enqueue_only)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
