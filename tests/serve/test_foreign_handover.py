"""A gunicorn worker stopped while it starts refuses nothing, under a load that keeps sending
through the final stop.

The reloads of the servers users already run (``uvicorn --workers 2``, gunicorn with the
library's worker class and with uvicorn-worker's, two reloads each, then the final SIGTERM, under
a user's load) are the user-load matrix's (``tests/reliability/test_user_load.py``). Here
``final_stop_under_load`` adds what a reload can do to a worker that has not started yet: one
new worker of a gunicorn HUP gets SIGTERM during its app's startup (as gunicorn's next HUP or
TTOU sends it), under keep-alive clients, idle holders and clients that open a fresh connection
per request, one attempt each. Every request is answered or refused (503, or a refused
connection), none is reset after it was sent, none is refused before the final SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Final

import anyio
import httpx
import pytest

from forgezero_lifecycle.core._httpx import tls_context
from forgezero_lifecycle.stop.server import FIRST_BYTE_GRACE
from tests.cli.conftest import CONTROL_TOKEN, PROJECT_ROOT, free_port, popen_logged
from tests.reliability._load import HttpLoad, LateSenders, Router, Target, refused_before
from tests.reliability._records import ServerRecords
from tests.reliability._soak import report, scale
from tests.reliability._verify import judge_stop

from .conftest import alive
from .test_foreign import _children as children_of
from .test_foreign import _workers
from .test_handover import LABEL, _close, _merged

pytestmark = [pytest.mark.server, pytest.mark.load, pytest.mark.anyio]

#: The runtime's signal_drain_timeout in the app (its default).
DRAIN_TIMEOUT: Final = 30.0
#: gunicorn's keep-alive timeout here: uvicorn's default, above the load's idle expiry.
GUNICORN_KEEP_ALIVE: Final = 5


WORKER_CLASSES: Final = {
    "gunicorn-ours": "forgezero_lifecycle.gunicorn.UvicornWorker",
    "gunicorn-uvicorn-worker": "uvicorn_worker.UvicornWorker",
}


def _command(kind: str, port: int) -> list[str]:
    """gunicorn with 2 workers of ``kind``'s worker class."""
    # Imported here: `make test-oldest` runs this module without gunicorn (-k 'not gunicorn').
    from forgezero_lifecycle.gunicorn import required_graceful_timeout

    return [
        sys.executable, "-m", "gunicorn", "tests.serve.reliability_app:app", "-w", "2",
        "-k", WORKER_CLASSES[kind], "-b", f"127.0.0.1:{port}",
        "--graceful-timeout", str(required_graceful_timeout(DRAIN_TIMEOUT)),
        # gunicorn's keep-alive is 2 s, the load's idle expiry too: at equal timeouts a request
        # meets the server's idle close, drain or not (docs/servers.md); uvicorn's is 5 s.
        "--keep-alive", str(GUNICORN_KEEP_ALIVE),
        "--log-level", "warning",
    ]  # fmt: skip


async def _live(url: str) -> bool:
    """Whether a worker answers the liveness probe (which the records leave out)."""
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=2, verify=tls_context()) as client:
            return (await client.get(url + "/.forgezero/runtime/live")).status_code == 200
    except httpx.TransportError:
        return False


#: The final stop under a load that keeps sending through it: keep-alive clients, idle holders
#: (they wait up to IDLE_THINK between requests on a kept-alive connection) and clients that open
#: a fresh connection per request and send up to FRESH_LATENESS after the connect.
FINAL_CLIENTS: Final = 30
IDLE_HOLDERS: Final = 10
IDLE_THINK: Final = 1.5
FRESH_CLIENTS: Final = 10
FRESH_LATENESS: Final = 0.3
#: How long the app's startup takes in the reload whose starting worker is stopped.
STARTUP_DELAY: Final = 2.0
#: The load goes on this long after the server's parent is gone (it must meet a refused port).
LOAD_AFTER_EXIT: Final = 0.5


async def final_stop_under_load(
    kind: str, tmp_path: Path, seed: int, *, stop_a_starting_worker: bool = False
) -> dict[str, object]:
    """One reload, then the final SIGTERM while every client keeps sending: each request judged
    once (answered, refused with 503 or a refused connection, or lost). ``stop_a_starting_worker``:
    the app's startup takes STARTUP_DELAY, and one new worker of the reload gets SIGTERM during
    it (as gunicorn's next HUP or TTOU sends it)."""
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
    if stop_a_starting_worker:
        environment["FZREL_STARTUP_DELAY"] = str(STARTUP_DELAY)
    process = await anyio.to_thread.run_sync(
        lambda: popen_logged(_command(kind, port), environment, log_path)
    )
    seen: set[int] = set()
    url = f"http://127.0.0.1:{port}"
    loads = [
        HttpLoad(_one_port(url, FINAL_CLIENTS), clients=FINAL_CLIENTS, seed=seed, retry=False),
        HttpLoad(
            _one_port(url, IDLE_HOLDERS),
            clients=IDLE_HOLDERS,
            seed=seed + 1,
            think=IDLE_THINK,
            retry=False,
            kinds=("fast", "post"),
        ),
    ]
    fresh = LateSenders(url, LABEL, clients=FRESH_CLIENTS, seed=seed, lateness=FRESH_LATENESS)
    exit_code: int | None = None
    signalled = exited = reloaded = 0.0
    try:
        with anyio.fail_after(60):
            while not await _live(url):
                seen.update(children_of(process.pid))
                await anyio.sleep(0.1)
        async with anyio.create_task_group() as group:
            for load in loads:
                group.start_soon(load.run)
            group.start_soon(fresh.run)
            await anyio.sleep(1.0)  # the load is under way (not a margin: any time would do)
            first = _workers(process.pid)
            seen |= first
            process.send_signal(signal.SIGHUP)
            reloaded = time.monotonic()
            if stop_a_starting_worker:
                with anyio.fail_after(30):
                    while not _workers(process.pid) - first:  # noqa: ASYNC110 - /proc
                        await anyio.sleep(0.02)
                # Margin: SIGTERM within ~0.1 s of the fork, well inside its STARTUP_DELAY.
                starting = min(_workers(process.pid) - first)
                seen.add(starting)
                os.kill(starting, signal.SIGTERM)
                first.add(starting)
            with anyio.fail_after(60):  # the reload is over once every first worker is gone
                while first & _workers(process.pid):
                    seen.update(children_of(process.pid))
                    await anyio.sleep(0.1)
            with anyio.fail_after(60):  # and the workers that replace them serve
                while not await _live(url):  # noqa: ASYNC110 - a probe over HTTP
                    await anyio.sleep(0.1)
            seen.update(children_of(process.pid))
            await anyio.sleep(1.0)  # the new workers carry the load for a while
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            exit_code = await anyio.to_thread.run_sync(lambda: process.wait(60))
            exited = time.monotonic()
            await anyio.sleep(LOAD_AFTER_EXIT)
            for load in loads:
                load.stop()
            fresh.stop()
    finally:
        seen.update(children_of(process.pid))
        if process.poll() is None:
            process.kill()
            await anyio.to_thread.run_sync(lambda: process.wait(60))
        for pid in seen:
            with contextlib.suppress(ProcessLookupError):
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
        for load in loads:
            await _close(load)
    per_pid = ServerRecords.per_pid(records)
    all_records = [r for load in loads for r in load.records] + fresh.records
    verdict = judge_stop(all_records, _merged(per_pid))
    refused = refused_before(all_records, signalled)
    return {
        **verdict.counts(),
        "requests": len(all_records),
        "refused_before_stop": len(refused),
        # Which, how, and when (seconds after the reload's SIGHUP), for the failure's message.
        "refused_before": [(r.id, r.outcome, round(r.done_at - reloaded, 2)) for r in refused[:10]],
        "silent_past_grace": sum(r.silent > FIRST_BYTE_GRACE for r in fresh.records),
        "refused_at_close": sum(r.at_close for r in all_records),
        "after_stop": sum(r.done_at >= signalled for r in all_records),
        "stop_seconds": round(exited - signalled, 2),
        "problems": verdict.problems[:10],
        "exit_code": exit_code,
        "log": log_path.read_text()[-3000:],
    }


def _one_port(url: str, clients: int) -> Router:
    return Router(Target.open(LABEL, url, clients + 5))


@pytest.mark.timeout(scale(120, 600))
async def test_gunicorn_worker_stopped_while_starting_refuses_nothing(tmp_path: Path) -> None:
    """gunicorn: a new worker that gets SIGTERM during its start-up hands over once it serves,
    instead of draining at once and then accepting with intake closed (503 before the stop)."""
    result = await final_stop_under_load(
        "gunicorn-ours", tmp_path, seed=310, stop_a_starting_worker=True
    )
    report("foreign-stopped-while-starting", **{k: v for k, v in result.items() if k != "log"})
    assert result["problems"] == [], result
    assert result["lost"] == 0, result
    assert result["refused_before_stop"] == 0, result
