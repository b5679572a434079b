"""Same-port handover on SIGHUP under load: keep-alive clients pinned to one port lose nothing.

The load (``tests/reliability/_load.py``: fast, slow, streaming and POST requests on keep-alive
connections, plus WebSocket sessions that echo and reconnect on 1012) goes to one URL: the
router's primary and standby are the same port. Every worker records each request it starts and
finishes (one file per PID), and every request is judged against those records
(``tests/reliability/_verify.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Final

import anyio
import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from forgezero_lifecycle.core._httpx import tls_context
from tests.cli.conftest import CONTROL_TOKEN, PROJECT_ROOT, free_port, popen_logged
from tests.reliability._constants import HANDOFF_TOKEN
from tests.reliability._jobs import SharedJobs
from tests.reliability._load import HttpLoad, Router, Target
from tests.reliability._records import ServerRecords
from tests.reliability._soak import report, scale
from tests.reliability._verify import judge

from .conftest import StartSupervised, Supervised, alive
from .test_foreign import _children as children_of
from .test_foreign import _workers

# Every test here but test_second_sighup_refused sends a load (tests/conftest.py: load slots).
pytestmark = [pytest.mark.server, pytest.mark.anyio]

LABEL: Final = "port"
CLIENTS: Final = 30
SESSIONS: Final = 8
LOAD_SECONDS: Final = scale(2.0, 5.0)
#: Runs of the two-handover scenario (``make soak``: more).
#: Seeds per scenario: one in make test (tests/reliability/test_user_load.py puts every row
#: under a heavier load too), twenty under FORGEZERO_SOAK=1 (make soak).
RUNS: Final = scale(1, 20)
#: Durable jobs (0.5 s each) enqueued at the start: they run across both handovers.
JOBS: Final = 160
_GENERATION = re.compile(
    r"supervisor\.(?:serving|new_generation_ready) generation=(\d+) pids=\[([\d, ]+)\]"
)
_HANDED = re.compile(r"supervisor\.state_handed_over worker=\d+ cursor=served-(\d+)")
_DONE = re.compile(r"supervisor\.handover_done from=(\d+) to=(\d+) old_drain=(\S+) seconds=(\S+)")


def revision(number: int) -> str:
    return hashlib.sha1(f"handover generation {number}".encode()).hexdigest()


class Sessions:
    """WebSocket sessions on the port that echo, and reconnect when closed with 1012."""

    def __init__(self, url: str, count: int) -> None:
        self.url = "ws" + url.removeprefix("http") + "/ws"
        self.count = count
        self.opened = 0
        self.closes: Counter[int] = Counter()
        self.refused = 0
        self.problems: list[str] = []
        self.stopping = anyio.Event()

    async def run(self) -> None:
        async with anyio.create_task_group() as group:
            for number in range(self.count):
                group.start_soon(self._session, number)

    async def _session(self, number: int) -> None:
        while not self.stopping.is_set():
            try:
                async with connect(self.url, proxy=None, open_timeout=10, close_timeout=5) as ws:
                    if await ws.recv() != f"hello {LABEL}":
                        self.problems.append(f"session {number}: bad greeting")
                    self.opened += 1
                    sent = 0
                    while not self.stopping.is_set():
                        sent += 1
                        await ws.send(f"{number}:{sent}")
                        with anyio.fail_after(10):
                            if await ws.recv() != f"{number}:{sent}":
                                self.problems.append(f"session {number}: bad echo")
                        await anyio.sleep(0.05)
                return
            except InvalidStatus as refused:
                self.refused += 1
                self.problems.append(f"session {number}: handshake {refused.response.status_code}")
                return
            except ConnectionClosed as closed:
                if closed.rcvd is None:
                    self.problems.append(f"session {number}: cut without a close frame")
                    return
                self.closes[closed.rcvd.code] += 1
                if closed.rcvd.code != 1012:
                    self.problems.append(f"session {number}: close {closed.rcvd.code}")
                    return
            except OSError as error:
                self.problems.append(f"session {number}: {error!r}")
                return


def _start(
    start_supervised: StartSupervised,
    tmp_path: Path,
    *flags: str,
    env: dict[str, str] | None = None,
    workers: int = 2,
) -> tuple[Supervised, Path, Path]:
    revision_file = tmp_path / "revision"
    revision_file.write_text(revision(1))
    mode_file = tmp_path / "mode"
    mode_file.write_text("ok")
    records = tmp_path / "worker-records"
    records.mkdir()
    served = start_supervised(
        "--revision-file", str(revision_file), "--handover-grace", "1s",
        "--drain-timeout", "20s", "--start-timeout", "20s", *flags,
        workers=workers,
        target="tests.serve.reliability_app:app",
        env={
            "FORGEZERO_HANDOFF_TOKEN": HANDOFF_TOKEN,
            "FZREL_GENERATION": LABEL,
            "FZREL_RECORDS": str(records / "{pid}.records"),
            "FZREL_STREAM_GRACE": "1.0",
            "FZW_MODE_FILE": str(mode_file),
            **(env or {}),
        },
    )  # fmt: skip
    return served, revision_file, mode_file


def _records(served: Supervised, tmp_path: Path) -> dict[int, ServerRecords]:
    return ServerRecords.per_pid(tmp_path / "worker-records")


def _merged(per_pid: dict[int, ServerRecords]) -> ServerRecords:
    merged = ServerRecords()
    for records in per_pid.values():
        for request_id, times in records.started.items():
            merged.started[request_id].extend(times)
        for request_id, times in records.finished.items():
            merged.finished[request_id].extend(times)
        merged.damaged.extend(records.damaged)
    return merged


def _generations(log: str) -> dict[int, list[int]]:
    return {
        int(number): [int(pid) for pid in pids.split(",")]
        for number, pids in _GENERATION.findall(log)
    }


async def _wait_log(served: Supervised, text: str, bound: float = 90.0) -> None:
    await anyio.to_thread.run_sync(lambda: served.wait_log(text, bound))


class StaggeredLoad(HttpLoad):
    """The load with its clients started one by one: a worker accepts every connection that is
    queued when it wakes, so a burst of new connections would all land on one worker."""

    async def run(self) -> None:
        async with anyio.create_task_group() as group:
            for number in range(self.clients):
                group.start_soon(self._client, number)
                await anyio.sleep(0.03)


def _load(served: Supervised, seed: int) -> HttpLoad:
    router = Router(Target.open(LABEL, served.url, CLIENTS + 10))
    router.standby = Target.open(LABEL, served.url, CLIENTS + 10)  # the same port
    return StaggeredLoad(router, clients=CLIENTS, seed=seed)


async def _close(load: HttpLoad) -> None:
    await load.router.primary.http.aclose()
    if load.router.standby is not None:
        await load.router.standby.http.aclose()


def _judge_no_loss(load: HttpLoad, per_pid: dict[int, ServerRecords]) -> dict[str, Any]:
    verdict = judge(load.records, {LABEL: _merged(per_pid)})
    # Refused at admission; a request that crossed a connection's close (the keep-alive race,
    # answered by the stop's own 503 at the socket, never read) is counted apart.
    refused = sum(record.refusals for record in load.records if not record.at_close)
    at_close = sum(record.at_close for record in load.records)
    counts = {**verdict.counts(), "refused": refused, "refused_at_close": at_close}
    assert verdict.problems == [], verdict.problems[:10]
    assert verdict.lost == 0
    assert refused == 0
    assert verdict.connect_refused == 0
    assert verdict.transport_errors == 0
    return counts


@pytest.mark.load
@pytest.mark.parametrize("run", range(RUNS))
@pytest.mark.timeout(scale(300, 600))
async def test_two_sighups_lose_nothing(
    start_supervised: StartSupervised, tmp_path: Path, sqlite_jobs: SharedJobs, run: int
) -> None:
    """Two SIGHUP handovers under load: 0 lost, 0 refused; N distinct PIDs per generation, none in
    two; state handed over exactly; every durable job completed exactly once."""
    jobs_env = {**sqlite_jobs.env, "FZREL_JOB_SECONDS": "0.5", "FZREL_JOB_LEASE": "2"}
    served, revision_file, _ = _start(start_supervised, tmp_path, env=jobs_env)
    await sqlite_jobs.enqueue(JOBS)
    load = _load(served, seed=12 + run)
    sessions = Sessions(served.url, SESSIONS)
    async with anyio.create_task_group() as group:
        group.start_soon(load.run)
        group.start_soon(sessions.run)
        await anyio.sleep(LOAD_SECONDS)
        for number in (2, 3):
            revision_file.write_text(revision(number))
            served.signal(signal.SIGHUP)
            await _wait_log(served, f"supervisor.handover_done from={number - 1} to={number}")
            served.workers()
            await anyio.sleep(LOAD_SECONDS)
        load.stop()
        sessions.stopping.set()
    await _close(load)
    await sqlite_jobs.wait_done(JOBS, seconds=60)
    per_pid = _records(served, tmp_path)
    log = served.log()
    served.signal(signal.SIGTERM)
    assert await anyio.to_thread.run_sync(served.wait_exit) == 0

    counts = _judge_no_loss(load, per_pid)
    generations = _generations(log)
    assert sorted(generations) == [1, 2, 3]
    all_pids = [pid for pids in generations.values() for pid in pids]
    assert len(all_pids) == len(set(all_pids)) == 6, generations
    answering = {
        number: {pid for pid in pids if per_pid.get(pid) and per_pid[pid].started}
        for number, pids in generations.items()
    }
    for number, pids in answering.items():
        assert len(pids) == 2, (number, answering)
    handed = [int(n) for n in _HANDED.findall(log)]
    assert len(handed) == 4, log
    for index, old in enumerate((1, 2)):
        finished = sum(len(per_pid[pid].finished) for pid in generations[old])
        assert sum(handed[2 * index : 2 * index + 2]) == finished, (old, handed)
    done = _DONE.findall(log)
    assert [state for _, _, state, _ in done] == ["drained", "drained"]
    assert sessions.problems == []
    assert set(sessions.closes) <= {1012}
    assert not [pid for pid in all_pids if alive(pid)]
    assert sorted((await sqlite_jobs.effects_per_job()).values()) == [1] * JOBS
    committed = [job for records in per_pid.values() for job in records.jobs_committed]
    assert len(committed) == JOBS
    report(
        "supervisor-handover",
        run=run,
        workers=2,
        clients=CLIENTS,
        sessions=SESSIONS,
        handover_seconds=[float(seconds) for _, _, _, seconds in done],
        websocket_closes_1012=sessions.closes[1012],
        websocket_opened=sessions.opened,
        jobs=JOBS,
        jobs_by_generation={
            number: sum(len(per_pid[pid].jobs_committed) for pid in pids if pid in per_pid)
            for number, pids in generations.items()
        },
        **counts,
    )


@pytest.mark.load
@pytest.mark.parametrize("mode", ["crash", "hang"])
@pytest.mark.timeout(180)
async def test_failed_start_keeps_old(
    start_supervised: StartSupervised, tmp_path: Path, mode: str
) -> None:
    """A new generation that cannot start leaves the old one serving: crash on import, or never
    ready, the handover is aborted and nothing is lost meanwhile."""
    # 15 s: the first generation's two imports must fit in it while the suite loads the machine
    # (3 s did not, nor 8 s beside other runs); the new generation's hang is given as long.
    served, revision_file, mode_file = _start(start_supervised, tmp_path, "--start-timeout", "15s")
    before = served.workers()
    load = _load(served, seed=34)
    async with anyio.create_task_group() as group:
        group.start_soon(load.run)
        await anyio.sleep(LOAD_SECONDS)
        mode_file.write_text(mode)
        revision_file.write_text(revision(2))
        served.signal(signal.SIGHUP)
        await _wait_log(served, "supervisor.handover_aborted")
        await anyio.sleep(LOAD_SECONDS)
        load.stop()
    await _close(load)
    assert served.workers() == before
    per_pid = _records(served, tmp_path)
    _judge_no_loss(load, per_pid)
    assert {pid for pid, records in per_pid.items() if records.started} <= set(before)
    log = served.log()
    why = "crashes on import" if mode == "crash" else "was not ready within 15 s"
    assert why in log
    assert "generation 1 keeps serving" in log
    served.signal(signal.SIGTERM)
    assert await anyio.to_thread.run_sync(served.wait_exit) == 0


async def test_second_sighup_refused(start_supervised: StartSupervised, tmp_path: Path) -> None:
    """A second SIGHUP during a handover is refused: one handover at a time, it is logged and
    changes nothing."""
    served, revision_file, _ = _start(start_supervised, tmp_path)
    revision_file.write_text(revision(2))
    served.signal(signal.SIGHUP)
    await _wait_log(served, "supervisor.handover_begin")
    served.signal(signal.SIGHUP)
    await _wait_log(served, "supervisor.reload_refused")
    await _wait_log(served, "supervisor.handover_done from=1 to=2")
    await anyio.sleep(0.5)
    assert "handover_begin from=2" not in served.log()
    assert len(served.workers()) == 2


def _peer_command(kind: str, port: int) -> list[str]:
    if kind == "gunicorn":
        return [
            sys.executable, "-m", "gunicorn", "tests.serve.reliability_app:app", "-w", "2",
            "-k", "uvicorn_worker.UvicornWorker", "-b", f"127.0.0.1:{port}",
            "--graceful-timeout", "20", "--log-level", "warning",
            "--keep-alive", "5",  # above the load's idle expiry (2 s, gunicorn's default too)
        ]  # fmt: skip
    if kind == "granian":
        return [
            sys.executable, "-m", "granian", "--interface", "asgi", "--workers", "2",
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
            "tests.serve.reliability_app:app",
        ]  # fmt: skip
    return [
        sys.executable, "-m", "uvicorn", "tests.serve.reliability_app:app", "--workers", "2",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
        "--timeout-graceful-shutdown", "20",
    ]  # fmt: skip


@pytest.mark.load
@pytest.mark.parametrize("kind", ["gunicorn", "uvicorn", "granian"])
@pytest.mark.timeout(300)
async def test_peers_same_load(tmp_path: Path, kind: str) -> None:
    """The same load and two SIGHUP reloads under gunicorn -w 2, uvicorn --workers 2 and granian
    --workers 2, for comparison (reported; the peers promise nothing, so only the run itself is
    checked)."""
    port = free_port()
    records = tmp_path / "worker-records"
    records.mkdir()
    log_path = tmp_path / "server.log"
    environment = {
        **os.environ,
        "PYTHONPATH": str(PROJECT_ROOT),
        "FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN,
        "FZREL_GENERATION": LABEL,
        "FZREL_RECORDS": str(records / "{pid}.records"),
        "FZREL_STREAM_GRACE": "1.0",
    }
    process = await anyio.to_thread.run_sync(
        lambda: popen_logged(_peer_command(kind, port), environment, log_path)
    )
    seen: set[int] = set()
    url = f"http://127.0.0.1:{port}"
    try:
        with anyio.fail_after(60):
            while not await _answers(url):
                seen.update(children_of(process.pid))
                await anyio.sleep(0.1)
        load = _load_at(url, seed=56)
        async with anyio.create_task_group() as group:
            group.start_soon(load.run)
            await anyio.sleep(LOAD_SECONDS)
            for _ in range(2):
                before = _workers(process.pid)
                seen |= before
                process.send_signal(signal.SIGHUP)
                with anyio.fail_after(60):  # the reload is over once every old worker is gone
                    while before & _workers(process.pid):  # noqa: ASYNC110 - exits seen in /proc
                        await anyio.sleep(0.05)
                seen.update(children_of(process.pid))
                await anyio.sleep(LOAD_SECONDS)  # the new workers carry the load for a while
            load.stop()
        await _close(load)
    finally:
        seen.update(children_of(process.pid))
        if process.poll() is None:
            process.terminate()
            await anyio.to_thread.run_sync(lambda: process.wait(60))
        for pid in seen:
            with contextlib.suppress(ProcessLookupError):
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
    per_pid = ServerRecords.per_pid(records)
    verdict = judge(load.records, {LABEL: _merged(per_pid)})
    refused = sum(record.refusals for record in load.records)
    report(
        f"peer-handover-{kind}",
        workers=2,
        clients=CLIENTS,
        refused=refused,
        pids_answering=sum(1 for r in per_pid.values() if r.started),
        **verdict.counts(),
    )
    assert verdict.requests > 0


async def _answers(url: str) -> bool:
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=2, verify=tls_context()) as client:
            return (await client.get(url + "/fast")).status_code == 200
    except httpx.TransportError:
        return False


def _load_at(url: str, seed: int) -> HttpLoad:
    router = Router(Target.open(LABEL, url, CLIENTS + 10))
    router.standby = Target.open(LABEL, url, CLIENTS + 10)
    return StaggeredLoad(router, clients=CLIENTS, seed=seed)
