"""A job worker process for the multi-process tests (one generation of the service).

Usage: python proc_worker.py --store sqlite|postgres --target PATH_OR_DSN [--schema S]
       --owner NAME --mode work|hang [--lease S] [--concurrency N] [--drain-timeout S]
       [--work-ms MS] [--hold]

``work`` handlers insert ``(job_id, owner)`` into ``app_results`` inside the completion
transaction; with ``--hold`` they first print ``CLAIMED`` (once) and wait for a line on stdin.
``hang`` handlers print ``STARTED <id> <fence>`` and block. SIGTERM drains the worker
(``worker.stop(drain_timeout)``) and prints ``DRAINED``. Lines go to stdout, flushed.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys
from typing import Any

from forgezero_lifecycle.jobs import JobWorker, Lease, SQLiteJobStore


def say(line: str) -> None:
    print(line, flush=True)


async def main(args: argparse.Namespace) -> None:
    store: Any
    if args.store == "sqlite":
        store = SQLiteJobStore(args.target)
        insert = "INSERT INTO app_results (job_id, owner) VALUES (?, ?)"
    else:
        from forgezero_lifecycle.jobs.postgres import PostgresJobStore

        store = PostgresJobStore(args.target, schema=args.schema, max_size=4)
        insert = f'INSERT INTO "{args.schema}".app_results (job_id, owner) VALUES (%s, %s)'
    await store.open()
    worker = JobWorker(
        store,
        concurrency=args.concurrency,
        lease=args.lease,
        owner=args.owner,
        idle_interval=0.05,
        release_margin=args.drain_timeout / 4,
    )

    loop = asyncio.get_running_loop()
    released = asyncio.Event()
    claimed = False

    def release() -> None:  # stdin has a line (or is closed): the held handlers go on
        loop.remove_reader(sys.stdin.fileno())
        released.set()

    @worker.handler("q")
    async def handle(lease: Lease[Any]) -> None:
        nonlocal claimed
        if args.mode == "hang":
            say(f"STARTED {lease.job.id} {lease.fence}")
            await asyncio.Event().wait()
        if args.hold:
            if not claimed:
                claimed = True
                say("CLAIMED")
            await released.wait()
        await asyncio.sleep(random.random() * args.work_ms / 1000)  # outside the write lock
        async with lease.commit() as conn:
            await conn.execute(insert, (lease.job.id, args.owner))

    if args.hold:
        loop.add_reader(sys.stdin.fileno(), release)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    worker.start()
    say("READY")
    await stop.wait()
    await worker.stop(timeout=args.drain_timeout)
    say(f"DRAINED released={worker.statistics().released}")
    await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", choices=("sqlite", "postgres"), required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--schema", default="forgezero")
    parser.add_argument("--owner", required=True)
    parser.add_argument("--mode", choices=("work", "hang"), default="work")
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--drain-timeout", type=float, default=1.0)
    parser.add_argument("--work-ms", type=float, default=3.0)
    parser.add_argument("--hold", action="store_true")
    asyncio.run(main(parser.parse_args()))
