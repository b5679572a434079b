"""Nothing lost at the socket: one process stopped by SIGTERM while clients keep hitting its port.

No router and no next generation: the clients have only this port, as on one host, in docker
compose or behind a proxy that does not retry. Each request gets one attempt and is judged
against the server's own records (``_verify.judge_stop``): answered, refused (a 503 the app never
saw, or a refused connection: both safe to retry), or lost (sent, and no answer). Under
``forgezero-lifecycle serve`` nothing may be lost; bare uvicorn under the same load is the anchor,
measured side by side and reported (RELIABILITY.md quotes both).

The load: keep-alive clients sending fast, slow, streaming and POST requests; clients that hold
idle keep-alive connections between requests; and raw clients that connect and send late.
"""

from __future__ import annotations

import signal
import time
from typing import Final

import anyio
import pytest

from tests.real_servers._servers import SERVE_KINDS

from ._fleet import Fleet, Generation
from ._load import HttpLoad, LateSenders, RequestRecord, Router, Target
from ._soak import report, scale
from ._verify import judge_stop

pytestmark = [pytest.mark.server, pytest.mark.load, pytest.mark.anyio]

#: Stops per HTTP implementation: one in make test (tests/reliability/test_user_load.py stops
#: ``serve`` under a heavier load too), twenty under FORGEZERO_SOAK=1 (make soak).
RUNS: Final = scale(1, 20)
CLIENTS: Final = 40
IDLE_HOLDERS: Final = 10
#: Idle holders wait up to this long between requests on their kept-alive connection.
IDLE_THINK: Final = 2.0
LATE_SENDERS: Final = 10
#: A late sender waits up to this long between its connect and its request (below the first-byte
#: grace of ``serve``, 1 s by default).
LATENESS: Final = 0.5
LOAD_BEFORE_STOP: Final = scale(1.0, 3.0)
#: The load goes on this long after the process is gone (it must meet a refused port).
LOAD_AFTER_EXIT: Final = 0.5


async def _stop_under_load(fleet: Fleet, kind: str, label: str, seed: int, **env: str) -> dict:
    generation = await fleet.start(label, kind=kind, FZREL_STREAM_GRACE="3", **env)
    loads = [
        HttpLoad(_router(generation, CLIENTS), clients=CLIENTS, seed=seed, retry=False),
        HttpLoad(
            _router(generation, IDLE_HOLDERS),
            clients=IDLE_HOLDERS,
            seed=seed + 1,
            think=IDLE_THINK,
            retry=False,
            kinds=("fast", "post"),
        ),
    ]
    late = LateSenders(generation.url, label, clients=LATE_SENDERS, seed=seed, lateness=LATENESS)
    async with anyio.create_task_group() as group:
        for load in loads:
            group.start_soon(load.run)
        group.start_soon(late.run)
        await anyio.sleep(LOAD_BEFORE_STOP)
        signalled = time.monotonic()
        generation.server.process.send_signal(signal.SIGTERM)  # by PID
        exit_code = await anyio.to_thread.run_sync(lambda: generation.server.process.wait(30))
        exited = time.monotonic()
        await anyio.sleep(LOAD_AFTER_EXIT)
        for load in loads:
            load.stop()
        late.stop()
    for load in loads:
        await load.router.primary.http.aclose()
    records: list[RequestRecord] = [r for load in loads for r in load.records] + late.records
    verdict = judge_stop(records, generation.records())
    exposed = [r for r in records if r.done_at >= signalled]
    return {
        "kind": kind,
        "exit_code": exit_code,
        "requests": len(records),
        "exposed_to_stop": len(exposed),
        "stop_seconds": round(exited - signalled, 2),
        **verdict.counts(),
        "problems": verdict.problems[:20],
        "log_problems": generation.log_problems(),
    }


def _router(generation: Generation, clients: int) -> Router:
    return Router(Target.open(generation.label, generation.url, clients + 5))


@pytest.mark.timeout(scale(240, 2400))
@pytest.mark.parametrize("kind", SERVE_KINDS)
async def test_sigterm_loses_nothing(fleet: Fleet, kind: str) -> None:
    """SIGTERM under load loses no request: every request that reaches the port is answered or
    refused, through the whole stop."""
    runs = [await _stop_under_load(fleet, kind, f"s{n}", seed=n) for n in range(RUNS)]
    report("stop-under-load-serve", runs=runs, lost_per_run=[r["lost"] for r in runs])
    for run in runs:
        assert run["problems"] == [], run
        assert run["lost"] == 0, run
        assert run["exit_code"] == 0, run
        assert run["log_problems"] == [], run
        # The load really met the stop: refusals at the HTTP and at the TCP level both happened.
        assert run["refused_503"] > 0, run
        assert run["connect_refused"] > 0, run


@pytest.mark.timeout(scale(120, 1200))
async def test_bare_uvicorn_stop(fleet: Fleet) -> None:
    """The anchor: plain uvicorn with no runtime, stopped the same way (measured, not judged)."""
    runs = [
        await _stop_under_load(fleet, kind, f"b{n}{kind[-3:]}", seed=100 + n, FZREL_BARE="1")
        for n in range(scale(1, 10))
        for kind in ("uvicorn-h11", "uvicorn-httptools")
    ]
    report("stop-under-load-bare-uvicorn", runs=runs, lost_per_run=[r["lost"] for r in runs])
    assert all(run["exposed_to_stop"] > 0 for run in runs)
    # Whatever it lost, it never ran a request it refused.
    assert not [p for run in runs for p in run["problems"] if "after it ran" in p]
