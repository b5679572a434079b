"""The anchor: plain uvicorn (no runtime) stopped by SIGTERM under the same load, measured.

The same app without a Runtime, the same 50 clients and the same router: the old process gets
SIGTERM mid-load, as a bare rolling deploy does, and the router moves to the next process a
moment later. A refused connection is retried on the next process (safe: nothing was sent);
anything else that fails is a request the client cannot know the fate of. The figures go to the
report (RELIABILITY.md quotes them); the test asserts only that the measurement happened and
that the server-side records agree with what the clients saw.
"""

from __future__ import annotations

import time
from typing import Final

import anyio
import pytest

from ._fleet import Fleet
from ._load import HttpLoad, Router, Target
from ._soak import report, scale
from ._verify import judge

pytestmark = [pytest.mark.server, pytest.mark.load, pytest.mark.anyio]

ROUNDS: Final = scale(2, 10)
CLIENTS: Final = 50
LOAD_BEFORE_SIGTERM: Final = scale(1.0, 5.0)
#: The router keeps sending to the stopping process this long (the same window as the handover).
ROUTER_LAG: Final = 0.3


@pytest.mark.timeout(scale(60, 900))
async def test_bare_uvicorn_sigterm(fleet: Fleet) -> None:
    """Measure what a bare uvicorn SIGTERM mid-load costs (the anchor the runtime is compared to)."""
    current = await fleet.start("a0", FZREL_BARE="1")
    router = Router(Target.open("a0", current.url, CLIENTS + 10))
    load = HttpLoad(router, clients=CLIENTS, seed=7)
    stopped_at: dict[str, float] = {}
    async with anyio.create_task_group() as group:
        group.start_soon(load.run)
        for number in range(1, ROUNDS + 1):
            label = f"a{number}"
            following = await fleet.start(label, FZREL_BARE="1")
            router.standby = Target.open(label, following.url, CLIENTS + 10)
            await anyio.sleep(LOAD_BEFORE_SIGTERM)
            stopped_at[current.label] = time.monotonic()
            current.server.process.terminate()  # by PID; the fleet reaps it
            await anyio.sleep(ROUTER_LAG)
            old = router.switch()
            await anyio.to_thread.run_sync(lambda p=current.server.process: p.wait(15))
            await old.wait_quiet()
            await old.http.aclose()
            current = following
        await anyio.sleep(LOAD_BEFORE_SIGTERM)
        load.stop()
    await router.primary.http.aclose()

    servers = {g.label: g.records() for g in fleet.generations}
    verdict = judge(load.records, servers)
    # Requests that were at a stopping process when (or after) it got SIGTERM.
    exposed = [
        r
        for r in load.records
        if any(r.done_at >= stopped_at.get(a.target, float("inf")) for a in r.attempts)
    ]
    failed = [r for r in exposed if r.served_by is None]
    report(
        "anchor-bare-uvicorn-sigterm",
        rounds=ROUNDS,
        clients=CLIENTS,
        **verdict.counts(),
        exposed_to_sigterm=len(exposed),
        failed_of_exposed=len(failed),
        failed_fraction_of_exposed=round(len(failed) / max(1, len(exposed)), 4),
        failed_fraction_of_all=round(verdict.lost / max(1, verdict.requests), 4),
        # Without a router that retries refused connections, these would have failed too.
        connect_refused_fraction_of_exposed=round(
            sum(any(a.outcome == "connect-refused" for a in r.attempts) for r in exposed)
            / max(1, len(exposed)),
            4,
        ),
        failure_kinds=sorted({r.outcome.split(":")[1] for r in failed if ":" in r.outcome}),
    )
    assert verdict.requests > 0
    assert exposed, "no request met a stopping process: the anchor measured nothing"
    # Whatever failed, no server ran a request twice or ran one no client sent.
    assert not [p for p in verdict.problems if " ran " in p]
