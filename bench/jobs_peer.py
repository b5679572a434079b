"""Durable job burn-down next to a peer library, procrastinate, on the same PostgreSQL.

``N`` no-op jobs are queued up front (not timed); then a worker at concurrency ``C`` runs them
all: ours is :class:`JobWorker` on :class:`PostgresJobStore` (claim, run, fenced completion),
the peer is procrastinate's worker (``run_worker_async(wait=False)``, which returns once the
queue is empty). Same jobs, same concurrency, same connection pool size (4 to 8), same
database: a scratch database created for the run and dropped at its end (procrastinate's
tables in ``public``, ours in a fresh schema per round). Rounds alternate which side goes first;
the ratio is the median of the per-round ratios ours / procrastinate.

procrastinate is not a dependency of the library: it comes with the ``bench`` extra
(``pip install -e '.[bench]'``, which ``make bench`` runs). Needs a DSN in ``FORGEZERO_BENCH_POSTGRES_DSN`` (or
``FORGEZERO_TEST_POSTGRES_DSN``, or ``--postgres-dsn``) of a role that may create databases.
Run ``python -m bench.jobs_peer [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Final

from bench._report import not_run, paired, print_table, row

__all__ = ["available", "run"]

POOL_MIN: Final = 4
POOL_MAX: Final = 8


def available(dsn: str | None = None) -> str | None:
    """Why the rows cannot be produced, or None when they can."""
    if _dsn(dsn) is None:
        return "no PostgreSQL DSN (set FORGEZERO_BENCH_POSTGRES_DSN; make bench sets a default)"
    try:
        import procrastinate  # noqa: F401
    except ImportError:
        return "procrastinate is not installed (pip install -e '.[bench]'; make bench does)"
    return None


def _dsn(explicit: str | None = None) -> str | None:
    return (
        explicit
        or os.environ.get("FORGEZERO_BENCH_POSTGRES_DSN")
        or os.environ.get("FORGEZERO_TEST_POSTGRES_DSN")
    )


@contextlib.asynccontextmanager
async def _scratch_database(dsn: str) -> AsyncIterator[str]:
    """A database of its own for the run; dropped afterwards, whatever happens."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    name = f"fz_bench_peer_{uuid.uuid4().hex[:10]}"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(dsn, dbname=name)
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- ours -----------------------------------------------------------------------------------


async def _ours(dsn: str, jobs: int, concurrency: int) -> float:
    import psycopg

    from forgezero_lifecycle.jobs import JobWorker, Lease, PostgresJobStore

    schema = f"fz_bench_{uuid.uuid4().hex[:10]}"
    store = PostgresJobStore(dsn, schema=schema, min_size=POOL_MIN, max_size=POOL_MAX)
    await store.open()
    try:
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
        if (await store.statistics()).done != jobs:
            raise RuntimeError(f"ours: expected {jobs} jobs done, got {await store.statistics()}")
        return jobs / elapsed
    finally:
        await store.close()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# -- procrastinate --------------------------------------------------------------------------


async def _peer(dsn: str, jobs: int, concurrency: int) -> float:
    import procrastinate

    connector = procrastinate.PsycopgConnector(conninfo=dsn, min_size=POOL_MIN, max_size=POOL_MAX)
    app = procrastinate.App(connector=connector)

    @app.task(name="noop", queue="bench")
    async def noop(i: int) -> None:
        return None

    async with app.open_async():
        await _reset_peer(app)
        payloads: list[Any] = [{"i": i} for i in range(jobs)]
        await noop.batch_defer_async(*payloads)
        started = time.perf_counter()
        await app.run_worker_async(
            queues=["bench"], concurrency=concurrency, wait=False, install_signal_handlers=False
        )
        elapsed = time.perf_counter() - started
        done = await app.connector.execute_query_one_async(
            "SELECT count(*) AS n FROM procrastinate_jobs WHERE status = 'succeeded'"
        )
        if done["n"] != jobs:
            raise RuntimeError(f"procrastinate: expected {jobs} jobs succeeded, got {done['n']}")
    return jobs / elapsed


async def _reset_peer(app: Any) -> None:
    """Empty procrastinate's tables between rounds (its schema is applied once per database)."""
    exists = await app.connector.execute_query_one_async(
        "SELECT to_regclass('procrastinate_jobs') IS NOT NULL AS present"
    )
    if not exists["present"]:
        await app.schema_manager.apply_schema_async()
        return
    await app.connector.execute_query_async(
        "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers CASCADE"
    )


# -- driver ----------------------------------------------------------------------------------


async def _measure(dsn: str, jobs: int, concurrency: int, rounds: int) -> tuple[list[float], ...]:
    ours: list[float] = []
    peer: list[float] = []
    async with _scratch_database(dsn) as scratch:
        await _peer(scratch, min(jobs, 200), concurrency)  # schema, warm-up
        await _ours(scratch, min(jobs, 200), concurrency)
        for index in range(rounds):
            if index % 2:
                peer.append(await _peer(scratch, jobs, concurrency))
                ours.append(await _ours(scratch, jobs, concurrency))
            else:
                ours.append(await _ours(scratch, jobs, concurrency))
                peer.append(await _peer(scratch, jobs, concurrency))
    return ours, peer


def run(quick: bool, dsn: str | None = None) -> list[dict[str, Any]]:
    """Rows per concurrency: our burn-down rate next to procrastinate's, or one row saying why
    they could not be measured (no DSN, procrastinate not installed)."""
    command = "FORGEZERO_BENCH_POSTGRES_DSN=... .venv/bin/python -m bench.jobs_peer"
    command += " --quick" if quick else ""
    if reason := available(dsn):
        return [not_run("jobs_peer.procrastinate burn-down", reason, command)]
    dsn = _dsn(dsn)
    assert dsn is not None
    import procrastinate

    jobs, rounds, levels = (1_000, 3, (32,)) if quick else (2_000, 5, (8, 32))
    version = getattr(procrastinate, "__version__", "")
    rows = []
    for concurrency in levels:
        ours, peer = asyncio.run(_measure(dsn, jobs, concurrency, rounds))
        ratios = paired(ours, peer)
        name = f"jobs_peer postgres burn-down, concurrency {concurrency}, {jobs:,} jobs"
        note = (
            f"ours: JobWorker + PostgresJobStore; peer: procrastinate {version} worker "
            f"(wait=False); pool {POOL_MIN}-{POOL_MAX} both; {rounds} rounds alternating; "
            "per-round ratios "
            f"{min(ratios):.2f} to {max(ratios):.2f}"
        )
        rows += [
            row(
                f"{name}: ours",
                "throughput",
                "jobs/s",
                ours,
                baseline=statistics.median(peer),
                ratio=round(statistics.median(ratios), 3),
                target="(comparison)",
                command=command,
                note=note,
            ),
            row(
                f"{name}: procrastinate",
                "throughput",
                "jobs/s",
                peer,
                baseline=None,
                ratio=None,
                target="baseline",
                command=command,
            ),
        ]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="1,000 jobs, concurrency 32 only")
    parser.add_argument("--postgres-dsn", help="PostgreSQL to use (default: from env)")
    args = parser.parse_args(argv)
    # procrastinate warns about an App defined in __main__ (its workers import tasks by path);
    # this worker runs in process, so the warning does not apply.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
    if args.postgres_dsn:
        os.environ["FORGEZERO_BENCH_POSTGRES_DSN"] = args.postgres_dsn
    print_table(run(args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
