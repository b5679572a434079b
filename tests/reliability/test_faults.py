"""Faults during a handover, with real uvicorn generations: a process killed, a deadline missed.

(``tests/jobs/test_processes.py`` kills bare worker processes; here the generations are the
served app, with its Runtime, control plane and worker, as an orchestrator sees them.)
"""

from __future__ import annotations

import signal
import time
from typing import Any, Final

import anyio
import httpx
import pytest

from forgezero_lifecycle._errors import LeaseLostError
from forgezero_lifecycle.jobs import JobStatistics, Lease

from ._fleet import Fleet, Generation
from ._jobs import SharedJobs
from ._load import HttpLoad, Router, Target
from ._soak import report, scale
from ._verify import judge

pytestmark = [pytest.mark.server, pytest.mark.load, pytest.mark.anyio]

CLIENTS: Final = 20
ACCEPTABLE_EXIT: Final = (0, -signal.SIGTERM)
#: How long the old generation's export takes, so a candidate can be killed mid-handoff.
EXPORT_DELAY: Final = "2"


async def _wait_for(check: Any, seconds: float = 15.0) -> Any:
    """Poll the async ``check`` until it returns something truthy (bounded)."""
    with anyio.fail_after(seconds):
        while not (value := await check()):  # noqa: ASYNC110 - another process's state
            await anyio.sleep(0.02)
    return value


@pytest.mark.timeout(scale(60, 600))
async def test_candidate_killed(
    fleet: Fleet,
) -> None:
    """SIGKILL of the candidate mid-handoff: the old one rolls back, serves, loses nothing."""
    old = await fleet.start("k0", FZREL_EXPORT_DELAY=EXPORT_DELAY)
    candidate = await fleet.start("k1")
    router = Router(Target.open("k0", old.url, CLIENTS + 5))
    load = HttpLoad(router, clients=CLIENTS, seed=11)
    async with anyio.create_task_group() as group:
        group.start_soon(load.run)
        await anyio.sleep(scale(0.5, 3.0))
        first = await old.begin_drain(candidate)
        await candidate.take_over_state(old, timeout_ms=10_000)
        await _wait_for(lambda: _exporting(old))
        await fleet.kill(candidate)
        with pytest.raises(httpx.ConnectError):
            await candidate.handoff_status("x" * 43)
        rolled_back = await old.control.rollback(first)
        assert rolled_back.status_code == 200, rolled_back.text
        assert rolled_back.json()["status"] == "rolled-back"
        assert await old.control.ready() == 200
        await anyio.sleep(scale(0.5, 3.0))  # the old generation serves again, under load

        # A new candidate's attempt while the old generation serves fails: export needs a drain.
        second, retry = await _start_two(fleet, "k2", "k3")
        refused = await second.wait_handoff(await second.take_over_state(old))
        assert refused["status"] == "failed"
        assert refused["failure"] == "RUNTIME_STATE_SOURCE_HTTP_409"
        assert (await second.stats())["imported"] is None

        # A fresh drain towards another candidate then completes the handover.
        router.standby = Target.open("k3", retry.url, CLIENTS + 5)
        again = await old.begin_drain(retry)
        assert again != first
        drained = await old.control.wait_for_status(again, "drained", "failed")
        handed = await retry.wait_handoff(await retry.take_over_state(old))
        previous = router.switch()
        await previous.wait_quiet()
        await previous.http.aclose()
        await anyio.sleep(scale(0.5, 3.0))
        load.stop()
    await router.primary.http.aclose()
    exit_code, _ = await fleet.stop(old)

    servers = {g.label: g.records() for g in (old, retry)}
    verdict = judge(load.records, servers)
    report("candidate-killed-mid-handoff", clients=CLIENTS, **verdict.counts())
    assert verdict.problems == []
    assert verdict.transport_errors == 0
    assert drained["status"] == "drained"
    assert handed["status"] == "acknowledged", handed
    assert (await retry.stats())["imported"]["served"] == len(servers["k0"].finished)
    assert exit_code in ACCEPTABLE_EXIT
    assert old.log_problems() == []


async def _exporting(generation: Generation) -> bool:
    return bool((await generation.stats())["exporting"])


async def _start_two(fleet: Fleet, first: str, second: str) -> tuple[Generation, Generation]:
    started: dict[str, Generation] = {}

    async def start(label: str) -> None:
        started[label] = await fleet.start(label)

    async with anyio.create_task_group() as group:
        group.start_soon(start, first)
        group.start_soon(start, second)
    return started[first], started[second]


@pytest.mark.timeout(scale(60, 300))
async def test_old_killed_mid_job(fleet: Fleet, jobs: SharedJobs) -> None:
    """SIGKILL mid-job: the next generation reclaims after the lease; no job is done twice, and the
    old generation's late commit is rejected."""
    total = scale(24, 200)
    old = await fleet.start("j0", FZREL_JOB_SECONDS="0.4", FZREL_JOB_LEASE="1.5", **jobs.env)
    await jobs.enqueue(total)
    await _wait_for(lambda: _job_progress(old), seconds=20)
    await fleet.kill(old)
    killed_at = time.monotonic()
    stale = old.records().uncommitted_jobs()
    assert stale, "nothing was running when the old generation was killed"

    new = await fleet.start("j1", FZREL_JOB_SECONDS="0.02", FZREL_JOB_LEASE="1.5", **jobs.env)
    await jobs.wait_done(total, seconds=scale(30, 120))
    reclaimed_after = min(t for (i, _), t in _begun_at(new).items() if i in dict(stale)) - killed_at

    per_job = await jobs.effects_per_job()
    assert sorted(per_job.values()) == [1] * total, "a job's effect is missing or doubled"
    for job_id, fence in stale:
        job = await jobs.store.get(job_id)
        assert job is not None
        assert job.state == "done"
        assert job.fence > fence
        assert job.attempts == 2, "an expired lease counts its attempt"
        late: Lease[Any] = Lease(jobs.store, job, fence=fence, owner=f"j0:{old.server.process.pid}")
        with pytest.raises(LeaseLostError):
            async with late.commit() as conn:
                await conn.execute(*jobs.insert(job_id, fence, "j0-late"))
    assert sorted((await jobs.effects_per_job()).values()) == [1] * total

    nonce = await new.begin_drain()
    drained = await new.control.wait_for_status(nonce, "drained", "failed")
    assert drained["status"] == "drained"
    assert drained["inFlight"]["jobs"] == 0
    report(
        "old-generation-killed-mid-job",
        store=jobs.kind,
        jobs=total,
        in_flight_at_kill=len(stale),
        done_by_old=len(old.records().jobs_committed),
        reclaimed_after_seconds=round(reclaimed_after, 2),
        lost=0,
        doubled=0,
    )
    assert new.log_problems() == []


async def _job_progress(generation: Generation) -> bool:
    """True once the generation committed some jobs and has others running."""
    records = generation.records()
    return len(records.jobs_committed) >= 4 and bool(records.uncommitted_jobs())


def _begun_at(generation: Generation) -> dict[tuple[int, int], float]:
    begun: dict[tuple[int, int], float] = {}
    for line in generation.records_path.read_text().splitlines():
        kind, *fields = line.split()
        if kind == "J":
            begun[(int(fields[0]), int(fields[1]))] = float(fields[2])
    return begun


@pytest.mark.timeout(60)
async def test_deadline_then_rollback(fleet: Fleet, sqlite_jobs: SharedJobs) -> None:
    """Work outliving timeoutMs fails the drain (TIMEOUT, counters); rollback serves it all."""
    gen = await fleet.start("d0", FZREL_JOB_SECONDS="2.5", FZREL_JOB_LEASE="5", **sqlite_jobs.env)
    await sqlite_jobs.enqueue(2)
    await _wait_for(lambda: _jobs_begun(gen, 2))
    results: list[httpx.Response] = []
    async with anyio.create_task_group() as group:
        for number in range(3):
            group.start_soon(_slow, gen, f"slow-{number}", results)
        await _wait_for(lambda: _http_in_flight(gen, 3))
        nonce = await gen.begin_drain(timeout_ms=1000)
        failed = await gen.control.wait_for_status(nonce, "failed", "drained")
        assert await gen.control.ready() == 503
        rolled_back = await gen.control.rollback(nonce)
        assert rolled_back.status_code == 200
        assert await gen.control.ready() == 200
        fast = await gen.http.get("/fast", headers={"x-request-id": "after-rollback"})
    assert failed["status"] == "failed"
    assert failed["failure"] == "RUNTIME_DRAIN_TIMEOUT"
    assert failed["inFlight"] == {"http": 3, "websocket": 0, "jobs": 0, "schedules": 0}
    assert fast.status_code == 200
    assert [r.status_code for r in results] == [200, 200, 200]
    await sqlite_jobs.wait_done(2, seconds=20)
    # The worker writes its commit record just after the store's commit returns: wait for both.
    await _wait_for(lambda: _jobs_committed(gen, 2))
    records = gen.records()
    assert sorted((await sqlite_jobs.effects_per_job()).values()) == [1, 1]
    assert [fence for _, fence in records.jobs_begun] == [1, 1, 2, 2]
    assert [fence for _, fence in records.jobs_committed] == [2, 2]
    for job_id, _ in records.jobs_committed:
        job = await sqlite_jobs.store.get(job_id)
        assert job is not None
        assert (job.attempts, job.fence) == (1, 2), "a release on drain refunds the attempt"
    assert await sqlite_jobs.store.statistics() == JobStatistics(done=2)
    report(
        "drain-deadline-expired",
        failure=failed["failure"],
        in_flight=failed["inFlight"],
        slow_requests_completed=len(results),
        jobs_released_then_done=2,
    )
    assert gen.log_problems() == []


async def _http_in_flight(generation: Generation, count: int) -> bool:
    return bool((await generation.stats())["inFlight"]["http"] >= count)


async def _jobs_begun(generation: Generation, count: int) -> bool:
    return len(generation.records().jobs_begun) >= count


async def _jobs_committed(generation: Generation, count: int) -> bool:
    return len(generation.records().jobs_committed) >= count


async def _slow(generation: Generation, request_id: str, into: list[httpx.Response]) -> None:
    headers = {"x-request-id": request_id}
    into.append(await generation.http.get("/slow", params={"ms": "2500"}, headers=headers))
