"""The demo's script: the blue/green sequence, driven through the public control API.

::

    1. generation A serves; HTTP clients, WebSockets and a job producer run against it
    2. generation B starts with claiming off and passes its private health check
    3. A drains through the control API while the load runs; refusals are retried on B
    4. A's typed state is handed to B (export -> begin on B -> acknowledged)
    5. B claims jobs (the ones A released too); the router switches to B; A stops
    6. every job is accounted for; B stops
    7. one host, one port, no router: ``serve --workers 2`` hands over on SIGHUP
       (:mod:`.same_port`); the report says what was lost (nothing)

Loopback only, bounded by :data:`BUDGET` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import orjson

from ..client import ControlClient, drain_request, handoff_request
from ..wire.drain import DrainStatus
from .jobs import WORK_QUEUE, freeze_one, open_store, prepare, tally, wake_frozen
from .load import HttpTally, Router, Target, WebSocketTally, run_http_client, run_websocket
from .processes import Generation, start_generation
from .report import HandoffResult, Report
from .same_port import same_port_handover
from .state import STATE_PROTOCOL, STATE_SCHEMA_VERSION

__all__ = ["BUDGET", "Plan", "run_demo"]

#: The whole demo, start to report, stays under a minute and a half.
BUDGET: Final = 85.0


@dataclass(frozen=True, slots=True)
class Plan:
    """How much load, for how long."""

    http_clients: int
    websockets: int
    jobs: int
    long_jobs: int
    warmup: float
    drain_timeout: float
    after_switch: float


FULL: Final = Plan(24, 6, 150, 2, 2.0, 5.0, 2.0)
SHORT: Final = Plan(8, 3, 40, 1, 1.0, 3.0, 1.0)


def run_demo(*, short: bool = False, postgres: str | None = None) -> int:
    """Run the demo and print its report; 0 only when nothing was lost."""
    try:
        return asyncio.run(_demo(SHORT if short else FULL, postgres))
    except KeyboardInterrupt:
        return 130


def _say(text: str) -> None:
    print(text, flush=True)


async def _demo(plan: Plan, dsn: str | None) -> int:
    with tempfile.TemporaryDirectory(prefix="forgezero-demo-") as tmp:
        generations: list[Generation] = []
        began = time.monotonic()
        try:
            async with asyncio.timeout(BUDGET):
                report = await _sequence(plan, dsn, Path(tmp), generations)
            report.elapsed = time.monotonic() - began
        except Exception as error:  # one clear line (and the servers' logs), not a traceback
            _say(f"demo failed: {type(error).__name__}: {error}")
            for generation in generations:
                _say(f"--- generation {generation.label} log (tail) ---\n{generation.log_tail()}")
            return 1
        finally:
            for generation in generations:
                await generation.kill()
    _say(report.render())
    return 0 if report.nothing_lost else 1


async def _sequence(
    plan: Plan, dsn: str | None, tmp: Path, generations: list[Generation]
) -> Report:
    run = secrets.token_hex(4)
    control_token, handoff_token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    schema = f"forgezero_demo_{run}" if dsn else None
    store = await open_store(dsn or str(tmp / "jobs.sqlite3"), schema)
    try:
        await prepare(store)
        env = {
            "FORGEZERO_CONTROL_TOKEN": control_token,
            "FORGEZERO_HANDOFF_TOKEN": handoff_token,
            "FORGEZERO_DEMO_JOBS": dsn or str(tmp / "jobs.sqlite3"),
            "FORGEZERO_DEMO_SCHEMA": schema or "",
        }
        report = await _handover(plan, store, env, tmp, generations, run)
        _say("7. one host, one port, no router: serve --workers 2, then SIGHUP hands it over")
        plain = {k: v for k, v in env.items() if not k.startswith("FORGEZERO_DEMO_")}
        report.same_port = await same_port_handover(
            plain, tmp, clients=plan.http_clients, seconds=plan.warmup
        )
        return report
    finally:
        if schema is not None:
            with contextlib.suppress(Exception):
                async with store.transaction() as conn:
                    await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await store.close()


async def _handover(
    plan: Plan, store: Any, env: dict[str, str], tmp: Path, gens: list[Generation], run: str
) -> Report:
    async with contextlib.AsyncExitStack() as stack:
        tasks: list[asyncio.Task[None]] = []
        stack.push_async_callback(_cancel, tasks)
        return await _steps(plan, store, env, tmp, gens, run, stack, tasks)


async def _steps(
    plan: Plan,
    store: Any,
    env: dict[str, str],
    tmp: Path,
    gens: list[Generation],
    run: str,
    stack: contextlib.AsyncExitStack,
    tasks: list[asyncio.Task[None]],
) -> Report:
    where = "PostgreSQL" if env["FORGEZERO_DEMO_SCHEMA"] else "SQLite"
    a = await start_generation("A", {**env, "FORGEZERO_DEMO_CLAIM": "now"}, tmp, drain_timeout=5)
    gens.append(a)
    http_a = await stack.enter_async_context(_http(a.url))
    router = Router(Target("A", a.url, http_a))
    stop, http, ws = asyncio.Event(), HttpTally(), WebSocketTally()
    job_ids: list[int] = []
    sessions = plan.websockets if _websockets_available() else 0
    tasks.append(asyncio.create_task(_produce_jobs(store, plan, run, job_ids, stop)))
    tasks += [
        asyncio.create_task(run_http_client(router, http, stop, seed))
        for seed in range(plan.http_clients)
    ]
    tasks += [asyncio.create_task(run_websocket(router, ws, stop)) for _ in range(sessions)]
    _say(
        f"1. generation A ({a.revision[:7]}) serves {a.url}: {plan.http_clients} HTTP clients, "
        f"{sessions} WebSockets, durable jobs in {where}"
    )
    await asyncio.sleep(plan.warmup)

    b = await start_generation("B", {**env, "FORGEZERO_DEMO_CLAIM": "later"}, tmp, drain_timeout=5)
    gens.append(b)
    http_b = await stack.enter_async_context(_http(b.url))
    router.standby = Target("B", b.url, http_b)
    _say(f"2. generation B ({b.revision[:7]}) is healthy at {b.url}; it does not claim jobs yet")

    long_ids = await _enqueue_long_jobs(store, plan, run)
    job_ids.extend(long_ids)
    await _wait_leased(store, long_ids)  # A is running them when its drain begins
    token, handoff_token = env["FORGEZERO_CONTROL_TOKEN"], env["FORGEZERO_HANDOFF_TOKEN"]
    control_a = ControlClient(a.url, token=token, handoff_token=handoff_token)
    control_b = ControlClient(b.url, token=token)
    async with control_a, control_b:
        _say(
            f"3. draining A through the control API (deadline {plan.drain_timeout:g} s); "
            "requests A refuses are retried on B"
        )
        request = drain_request(
            source_revision=a.revision,
            target_revision=b.revision,
            timeout_ms=round(plan.drain_timeout * 1000),
        )
        began = time.monotonic()
        await control_a.begin_drain(request)
        drained = await control_a.wait_drained(
            request.nonce, on_progress=_progress_printer(began), poll_interval=0.1
        )
        drain_seconds = time.monotonic() - began
        released = (await http_a.get("/_demo/stats")).json()["jobs"]["released"]
        frozen = await freeze_one(store, run)
        handoff = await _handoff(control_a, control_b, a, b, handoff_token)
        _say(f"4. A's state handed to B: {handoff.status}, cursor {handoff.cursor}")

    (await http_b.post("/_demo/claim")).raise_for_status()
    router.switch()
    waking = asyncio.create_task(wake_frozen(store, frozen, bound=15.0))
    _say("5. B claims jobs (A's released ones too); the router sends everything to B; A stops")
    await asyncio.sleep(plan.after_switch)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=10.0)
    exit_a = await a.stop()
    _say("6. every job accounted for; B stops")
    jobs = await tally(store, job_ids, bound=plan.drain_timeout + 10)
    stale = 1 if await waking else 0
    exit_b = await b.stop()
    return Report(
        store=where,
        http=http,
        websockets=ws if sessions else None,
        jobs=jobs,
        stale_rejected=stale,
        released_by_a=released,
        drain_state=drained.status,
        drain_seconds=drain_seconds,
        deadline_seconds=plan.drain_timeout,
        handoff=handoff,
        exit_codes={"A": exit_a, "B": exit_b},
    )


def _http(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=10.0, trust_env=False)


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _handoff(
    control_a: ControlClient, control_b: ControlClient, a: Generation, b: Generation, token: str
) -> HandoffResult:
    envelope = await control_a.export_state(a.revision, b.revision)
    size = len(orjson.dumps(envelope.model_dump(mode="json")))
    request = handoff_request(
        protocol=STATE_PROTOCOL,
        schema_version=STATE_SCHEMA_VERSION,
        source_revision=a.revision,
        target_revision=b.revision,
        source_url=f"{a.url}/.forgezero/runtime/state/v1/export"
        f"?sourceRevision={a.revision}&targetRevision={b.revision}&importCheck=importer",
        handoff_token=token,
    )
    await control_b.begin_handoff(request, timeout_ms=5000)
    async with asyncio.timeout(10):
        status = await control_b.wait_handoff(request.nonce, poll_interval=0.05)
    return HandoffResult(
        status=status.status,
        digest=status.digest or "",
        size=size,
        cursor=status.cursor or "",
        failure=status.failure or "",
    )


async def _produce_jobs(
    store: Any, plan: Plan, run: str, job_ids: list[int], stop: asyncio.Event
) -> None:
    """Enqueue short jobs at a steady pace (enqueue works while a generation drains)."""
    interval = (plan.warmup + plan.drain_timeout + 2.0) / plan.jobs
    for index in range(plan.jobs):
        if stop.is_set():
            return
        job = await store.enqueue(
            WORK_QUEUE,
            {"seconds": 0.05 + (index % 7) * 0.04},
            idempotency_key=f"demo:{run}:{index}",
        )
        job_ids.append(job.id)
        await asyncio.sleep(interval)


async def _enqueue_long_jobs(store: Any, plan: Plan, run: str) -> list[int]:
    """Jobs too long for A's drain deadline: A releases them and B runs them."""
    seconds = plan.drain_timeout + 1.0
    ids = []
    for index in range(plan.long_jobs):
        job = await store.enqueue(
            WORK_QUEUE, {"seconds": seconds}, idempotency_key=f"demo:{run}:long:{index}"
        )
        ids.append(job.id)
    return ids


async def _wait_leased(store: Any, job_ids: list[int]) -> None:
    async with asyncio.timeout(10):
        while True:
            jobs = [await store.get(job_id) for job_id in job_ids]
            if all(job is not None and job.state == "leased" for job in jobs):
                return
            await asyncio.sleep(0.05)


def _progress_printer(began: float) -> Any:
    last = [""]

    def show(status: DrainStatus) -> None:
        counters = " ".join(f"{k}={v}" for k, v in status.in_flight.model_dump().items())
        line = f"   {status.status:<8} {counters}"
        if line != last[0]:
            _say(f"{line}  {time.monotonic() - began:4.1f} s")
            last[0] = line

    return show


def _websockets_available() -> bool:
    try:
        import websockets  # noqa: F401
    except ImportError:
        return False
    return True
