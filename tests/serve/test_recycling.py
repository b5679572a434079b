"""Workers replaced while their generation serves on, with real processes under load:
recycling (``--max-requests``), the watchdog (``--worker-timeout``) and scaling (SIGTTIN,
SIGTTOU, ``supervisor/v1/scale``).

The load is ``tests/reliability/_load.py`` on keep-alive connections pinned to the one port;
every request is judged against the records each worker writes (``tests/reliability/_verify.py``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Final

import anyio
import httpx
import pytest

from forgezero_lifecycle.core._httpx import tls_context
from tests.cli.conftest import CONTROL_TOKEN
from tests.reliability._load import HttpLoad, Router, Target
from tests.reliability._records import ServerRecords
from tests.reliability._soak import report, scale

from .conftest import AUTH, StartSupervised, Supervised, alive
from .test_handover import CLIENTS, LABEL, _close, _judge_no_loss, _records, _wait_log
from .test_handover import _start as start_handover

pytestmark = [pytest.mark.server, pytest.mark.anyio]

LOAD_SECONDS: Final = scale(4.0, 14.0)
#: The load's requests: mostly fast ones, so that workers reach their request limits soon.
KINDS: Final = ("fast", "fast", "fast", "post", "stream", "slow")
#: The recycles the load waits for (at most :data:`RECYCLE_BOUND` seconds).
RECYCLES: Final = 2
RECYCLE_BOUND: Final = 60.0
#: The keep-alive clients of the recycling check under load (each pinned to its connection).
PINNED_CLIENTS: Final = 50
SCALE_PATH: Final = "/.forgezero/runtime/supervisor/v1/scale"
STATUS_PATH: Final = "/.forgezero/runtime/supervisor/v1/status"
#: How long the load runs before an event (a freeze, a signal, a request) and after it: the
#: load must be under way when the event comes and still sending when its effect lands. These
#: windows are the behaviour under test (requests through the event), not waits for a state.
UNDER_LOAD: Final = 1.0


def _start(
    start_supervised: StartSupervised, tmp_path: Path, *flags: str, workers: int = 2
) -> Supervised:
    served, _, _ = start_handover(start_supervised, tmp_path, *flags, workers=workers)
    return served


def _load(served: Supervised, seed: int, clients: int = CLIENTS) -> HttpLoad:
    router = Router(Target.open(LABEL, served.url, clients + 10))
    router.standby = Target.open(LABEL, served.url, clients + 10)  # the same port
    return HttpLoad(router, clients=clients, seed=seed, think=0.005, kinds=KINDS)


def _recycled(served: Supervised) -> int:
    return served.log().count("supervisor.replacement_done generation=1 kind=recycle")


async def _recycle_under_load(
    served: Supervised,
    tmp_path: Path,
    seed: int,
    *,
    clients: int = CLIENTS,
    recycles: int = RECYCLES,
    served_by: int = 0,
) -> dict[str, object]:
    """The load for :data:`LOAD_SECONDS`, and on until ``recycles`` workers were recycled and
    ``served_by`` workers have answered (a busy machine serves fewer requests a second)."""
    load = _load(served, seed=seed, clients=clients)

    def done() -> bool:
        if _recycled(served) < recycles:
            return False
        return served_by == 0 or len(_answering(_records(served, tmp_path))) >= served_by

    async with anyio.create_task_group() as group:
        group.start_soon(load.run)
        await anyio.sleep(LOAD_SECONDS)
        await anyio.to_thread.run_sync(
            lambda: served.wait_for(done, f"recycled {recycles}", RECYCLE_BOUND)
        )
        load.stop()
    await _close(load)
    per_pid = _records(served, tmp_path)
    log = served.log()
    served.signal(signal.SIGTERM)
    assert await anyio.to_thread.run_sync(served.wait_exit) == 0, log
    counts = _judge_no_loss(load, per_pid)
    return {**counts, "pids_answering": len(_answering(per_pid)), "recycled": _recycled(served)}


def _answering(per_pid: dict[int, ServerRecords]) -> set[int]:
    return {pid for pid, records in per_pid.items() if records.started}


@pytest.mark.load
@pytest.mark.timeout(300)
@pytest.mark.parametrize("preload", [(), ("--preload",)], ids=["spawned", "preload"])
async def test_recycling_under_load_loses_nothing(
    start_supervised: StartSupervised, tmp_path: Path, preload: tuple[str, ...]
) -> None:
    """``--workers 2 --max-requests 400 --max-requests-jitter 100`` under 50 pinned keep-alive
    clients, no SIGHUP, until six workers have served (four recycles): workers are recycled one
    at a time, 0 lost, 0 refused; with ``--preload`` too (each replacement forked)."""
    served = _start(
        start_supervised,
        tmp_path,
        "--max-requests",
        "400",
        "--max-requests-jitter",
        "100",
        *preload,
    )
    counts = await _recycle_under_load(
        served, tmp_path, seed=41, clients=PINNED_CLIENTS, recycles=4, served_by=6
    )
    assert counts["pids_answering"] >= 6, counts
    assert counts["refused"] == 0, counts
    report("supervisor-recycling" + "-preload" * bool(preload), workers=2, **counts)


@pytest.mark.load
@pytest.mark.timeout(300)
async def test_recycling_a_single_worker_loses_nothing(
    start_supervised: StartSupervised, tmp_path: Path
) -> None:
    """``--workers 1 --max-requests 300``: the one worker's replacement accepts before it stops
    accepting, so recycling the only worker is no outage: 0 lost, 0 refused."""
    served = _start(start_supervised, tmp_path, "--max-requests", "300", workers=1)
    counts = await _recycle_under_load(served, tmp_path, seed=42)
    assert counts["pids_answering"] >= 2, counts
    report("supervisor-recycling-one-worker", workers=1, **counts)


class Pinned:
    """Keep-alive clients sending ``/pid`` one after another; failures are counted, and a
    client whose request failed goes on with a new connection."""

    def __init__(self, url: str, clients: int) -> None:
        self.url = url
        self.clients = clients
        self.ok = 0
        self.failed = 0
        self.pids: set[int] = set()
        self.stopping = anyio.Event()

    async def run(self) -> None:
        async with anyio.create_task_group() as group:
            for _ in range(self.clients):
                group.start_soon(self._client)

    async def _client(self) -> None:
        while not self.stopping.is_set():
            async with httpx.AsyncClient(
                base_url=self.url, timeout=15, trust_env=False, verify=tls_context()
            ) as http:
                while not self.stopping.is_set():
                    try:
                        answer = await http.get("/pid")
                    except httpx.HTTPError:
                        self.failed += 1
                        break
                    if answer.status_code != 200:
                        self.failed += 1
                        break
                    self.ok += 1
                    self.pids.add(answer.json()["pid"])
                    await anyio.sleep(0.01)


@pytest.mark.load
@pytest.mark.timeout(180)
@pytest.mark.parametrize("preload", [(), ("--preload",)], ids=["spawned", "preload"])
async def test_frozen_worker_is_replaced_then_killed(
    start_supervised: StartSupervised, tmp_path: Path, preload: tuple[str, ...]
) -> None:
    """A worker stopped with SIGSTOP under ``--worker-timeout 2s``: a new worker answers, the
    frozen one is killed (logged with what it held, named in the status), and most requests
    succeed meanwhile; with ``--preload`` too (killed through its pidfd, its exit reported by
    the preload process)."""
    served = start_supervised("--worker-timeout", "2s", *preload, workers=2)
    before = served.workers()
    frozen = before[0]
    clients = Pinned(served.url, 30)
    async with anyio.create_task_group() as group:
        group.start_soon(clients.run)
        await anyio.sleep(UNDER_LOAD)
        os.kill(frozen, signal.SIGSTOP)
        frozen_at = time.monotonic()
        await _wait_log(served, "supervisor.replacement_done generation=1 kind=unresponsive", 30)
        replaced_in = time.monotonic() - frozen_at
        # The load goes on until the frozen worker is killed (the requests it held included).
        await _wait_log(served, f"supervisor.worker_killed worker 0 (pid {frozen})", 30)
        clients.stopping.set()
    log = served.log()
    assert f"supervisor.worker_unresponsive worker 0 (pid {frozen})" in log, log
    assert "it held http=" in log
    assert f"supervisor.worker_killed worker 0 (pid {frozen}) of generation 1: unresponsive" in log
    await anyio.to_thread.run_sync(
        lambda: served.wait_for(lambda: not alive(frozen), "the frozen worker gone")
    )
    # Its exit status, read by its parent (the supervisor, or the preload process it was
    # forked from).
    await _wait_log(served, f"(pid {frozen}) of generation 1 reason=killed by SIGKILL", 30)
    after = served.workers()
    assert frozen not in after
    assert len(after) == 2
    new = set(after) - set(before)
    assert new, (before, after)
    answering = await anyio.to_thread.run_sync(lambda: served.pids_answering(2))
    assert new <= answering, (new, answering)
    total = clients.ok + clients.failed
    assert clients.ok / total >= 0.95, (clients.ok, clients.failed)
    async with httpx.AsyncClient(
        base_url=served.url, trust_env=False, timeout=30, verify=tls_context()
    ) as http:
        status = (await http.get(STATUS_PATH, headers=AUTH)).json()
    assert [entry["pid"] for entry in status["unresponsive"]] == [frozen]
    assert status["replaced"] == {"unresponsive": 1}
    served.signal(signal.SIGTERM)
    assert await anyio.to_thread.run_sync(served.wait_exit) == 0
    report(
        "supervisor-watchdog" + "-preload" * bool(preload),
        replaced_seconds=round(replaced_in, 2),
        ok=clients.ok,
        failed=clients.failed,
    )


@pytest.mark.load
@pytest.mark.timeout(240)
async def test_ttin_ttou_and_scale_request(
    start_supervised: StartSupervised, tmp_path: Path
) -> None:
    """SIGTTIN adds a worker, SIGTTOU removes one (it hands its clients over and drains), and
    the authenticated scale call does the same; never below one worker; 0 lost under load."""
    served = _start(start_supervised, tmp_path)
    load = _load(served, seed=43)
    async with anyio.create_task_group() as group:
        group.start_soon(load.run)
        await anyio.sleep(UNDER_LOAD)
        served.signal(signal.SIGTTIN)
        await _wait_log(served, "supervisor.replacement_done generation=1 kind=scale-up", 60)
        assert len(served.workers()) == 3
        served.signal(signal.SIGTTOU)
        await _wait_log(served, "supervisor.worker_retiring")
        await anyio.to_thread.run_sync(
            lambda: served.wait_for(lambda: len(served.workers()) == 2, "two workers")
        )
        async with httpx.AsyncClient(
            base_url=served.url, trust_env=False, timeout=30, verify=tls_context()
        ) as http:
            unauthorized = await http.post(SCALE_PATH, json={"by": -1})
            assert unauthorized.status_code == 401
            bad = await http.post(SCALE_PATH, json={"by": 2}, headers=AUTH)
            assert bad.status_code == 400
            down = await http.post(SCALE_PATH, json={"by": -1}, headers=AUTH)
            assert down.status_code == 202, down.text
            assert down.json() == {"accepted": True, "workers": 1}
            await anyio.to_thread.run_sync(
                lambda: served.wait_for(lambda: len(served.workers()) == 1, "one worker")
            )
            floor = await http.post(SCALE_PATH, json={"by": -1}, headers=AUTH)
            assert floor.status_code == 409
            assert floor.json()["error"] == "RUNTIME_SCALE_REFUSED"
            status = (await http.get(STATUS_PATH, headers=AUTH)).json()
        await anyio.sleep(UNDER_LOAD)
        load.stop()
    await _close(load)
    assert status["size"] == 1
    assert status["replaced"] == {"scale-up": 1}
    assert len(served.workers()) == 1
    per_pid = _records(served, tmp_path)
    served.signal(signal.SIGTERM)
    assert await anyio.to_thread.run_sync(served.wait_exit) == 0
    _judge_no_loss(load, per_pid)
    assert CONTROL_TOKEN not in served.log()
