"""Same-port handover under a user's load: ``serve --workers 2`` and gunicorn with the library's
worker class, next to gunicorn, uvicorn and granian.

One host, one port, no router. The reliability app (``tests/serve/reliability_app.py``) runs
under each server with two worker processes, with the runtime in it under the library's two
ways and without it under the peers (what their users run today), while the HTTP clients of the
user-load matrix (``tests/reliability/_user_load.py``: 40 keep-alive clients, 10 slow ones, 10
that open a fresh connection per request; one attempt each) keep sending to that one port; the
server gets two SIGHUPs, the reload each of them documents, then SIGTERM while the clients still
send:

* ``forgezero-lifecycle serve --workers 2``: generation 2 starts on the same socket and proves it
  is ready, then generation 1 stops accepting and drains;
* gunicorn ``-w 2 -k forgezero_lifecycle.gunicorn.UvicornWorker``: new workers, then the old
  ones get SIGTERM; each hands its clients over, then drains (docs/servers.md);
* gunicorn ``-w 2 -k uvicorn_worker.UvicornWorker``: the same, through the runtime's signal hook;
* ``uvicorn --workers 2``: the workers are restarted one by one;
* granian ``--workers 2``: the workers are reloaded.

A request the server refused (a 503 ``RUNTIME_DRAINING`` or a refused connection: never
processed, so a client may send it again) counts as *refused*; one that got no answer, a cut
stream or another error counts as *lost*. Before the SIGTERM nothing may be refused; after it a
refusal is what a stop must give. Each round runs every server once, in a rotating order, in
fresh processes. Targets: ``serve`` and gunicorn with the library's worker class lose nothing and
refuse nothing before the stop, in every round. The peers promise nothing: their rows are
comparisons. A peer that is not installed (``pip install -e '.[bench]'``; ``make bench`` does)
is a row saying so.

Run ``python -m bench.handover [--quick]`` from the repository's root (the app and the load live
in ``tests/``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
from tests.reliability._user_load import FRESH, KEEP_ALIVE, SLOW, UserLoad

from bench._report import not_run, print_table, row
from forgezero_lifecycle.demo.processes import free_port, revision_of

__all__ = ["run"]

APP: Final = "tests.serve.reliability_app:app"
ROOT: Final = Path(__file__).resolve().parent.parent
#: The load's label, which the app's answers must carry.
LABEL: Final = "H"
RELOADS: Final = 2
#: Load before the first SIGHUP, after each reload and before the SIGTERM, in seconds.
STEADY: Final = 1.5
#: The load goes on this long after the server has exited (it must meet a refused port).
AFTER_EXIT: Final = 0.5
#: The runtime's drain deadline on a signal (a never-ending stream would hold a drain this long).
DRAIN_TIMEOUT: Final = 5.0
BOUND: Final = 60.0
COMMAND: Final = ".venv/bin/python -m bench.handover"
#: The rows with a target: the library's own ways of running several workers.
OURS: Final = frozenset({"serve", "gunicorn-ours"})
#: gunicorn's worker class per row.
WORKER_CLASSES: Final = {
    "gunicorn-ours": "forgezero_lifecycle.gunicorn.UvicornWorker",
    "gunicorn": "uvicorn_worker.UvicornWorker",
}
#: Each server: its module (to tell whether it is installed) and its command line.
SERVERS: Final = {
    "serve": "forgezero_lifecycle",
    "gunicorn-ours": "uvicorn_worker",
    "gunicorn": "uvicorn_worker",
    "uvicorn": "uvicorn",
    "granian": "granian",
}
_LABELS: Final = {
    "serve": "forgezero-lifecycle serve --workers 2",
    "gunicorn-ours": "gunicorn -w 2 (forgezero_lifecycle.gunicorn.UvicornWorker)",
    "gunicorn": "gunicorn -w 2 (UvicornWorker)",
    "uvicorn": "uvicorn --workers 2",
    "granian": "granian --workers 2",
}


@dataclass
class Handover:
    """What the clients of the one port saw across two reloads and the stop."""

    sent: int
    lost: int
    #: Refused before the SIGTERM (a reload must refuse nothing).
    refused: int
    #: Lost once the SIGTERM was sent (the stop at the socket).
    lost_at_stop: int
    #: serve only: SIGHUP → the old generation gone, per reload.
    seconds: list[float]
    problems: list[str]
    #: Whether the worker processes after each reload were all new ones.
    replaced: bool


def _command(kind: str, port: int, revision_file: Path) -> list[str]:
    where = ["--host", "127.0.0.1", "--port", str(port)]
    if kind == "serve":
        return [
            sys.executable, "-m", "forgezero_lifecycle", "serve", APP, "--workers", "2", *where,
            "--revision-file", str(revision_file), "--drain-timeout", f"{DRAIN_TIMEOUT:g}s",
            "--log-level", "info", "--no-access-log",
        ]  # fmt: skip
    if kind in WORKER_CLASSES:
        return [
            sys.executable, "-m", "gunicorn", APP, "-w", "2",
            "-k", WORKER_CLASSES[kind], "-b", f"127.0.0.1:{port}",
            "--graceful-timeout", "40", "--log-level", "warning",
            # gunicorn's keep-alive (2 s) is the load's idle expiry: raised to uvicorn's 5 s.
            "--keep-alive", "5",
        ]  # fmt: skip
    if kind == "granian":
        return [
            sys.executable, "-m", "granian", "--interface", "asgi", "--workers", "2", *where,
            "--log-level", "warning", APP,
        ]  # fmt: skip
    return [
        sys.executable, "-m", "uvicorn", APP, "--workers", "2", *where,
        "--log-level", "warning", "--timeout-graceful-shutdown", "20",
    ]  # fmt: skip


async def _handover(kind: str, workdir: Path) -> Handover:
    """One server, started, loaded, reloaded by SIGHUP and stopped; its whole process group is
    killed before this returns if it has not exited by then."""
    port = free_port()
    revision_file = workdir / f"{kind}.revision"
    revision_file.write_text(revision_of("H1") + "\n")
    log_path = workdir / f"{kind}.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "FORGEZERO_CONTROL_TOKEN": secrets.token_urlsafe(32),
        "FORGEZERO_HANDOFF_TOKEN": secrets.token_urlsafe(32),
        "FORGEZERO_REVISION": revision_of("H1"),
        "FZREL_GENERATION": LABEL,
        "FZREL_RECORDS": str(workdir / f"{kind}-{{pid}}.records"),
        "FZREL_STREAM_GRACE": "1.0",
        "FZREL_SIGNAL_DRAIN": f"{DRAIN_TIMEOUT:g}",
        **({} if kind in OURS else {"FZREL_BARE": "1"}),
    }
    async with server_process(_command(kind, port, revision_file), env, log_path) as process:
        return await _load_through_reloads(kind, process, port, revision_file, log_path)


@contextlib.asynccontextmanager
async def server_process(
    command: list[str], env: dict[str, str], log_path: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    """A server started in a process group of its own, its output in ``log_path``; when the
    block ends it gets SIGTERM, and the whole group SIGKILL if it has not exited 30 s later."""
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *command,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its workers share its process group: one kill ends all
        )
    try:
        yield process
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 30.0)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # leftover workers of the group it led
        if process.returncode is None:
            await process.wait()


async def _load_through_reloads(
    kind: str,
    process: asyncio.subprocess.Process,
    port: int,
    revision_file: Path,
    log_path: Path,
) -> Handover:
    url = f"http://127.0.0.1:{port}"
    await _until_answering(process, url, log_path)
    seconds: list[float] = []
    replaced = True
    load = UserLoad.open(url, LABEL)
    sending = asyncio.create_task(load.run())
    try:
        await asyncio.sleep(STEADY)
        for reload in range(2, RELOADS + 2):
            before = _children(process.pid)
            sighup_at = time.monotonic()
            await asyncio.to_thread(revision_file.write_text, revision_of(f"H{reload}") + "\n")
            process.send_signal(signal.SIGHUP)
            if kind == "serve":
                done = f"supervisor.handover_done from={reload - 1} to={reload}"
                await _until_logged(process, log_path, done)
            await _until_gone(process, before, log_path)
            seconds.append(time.monotonic() - sighup_at)
            after = _children(process.pid)
            replaced = replaced and bool(after) and not after & before
            await asyncio.sleep(STEADY)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), BOUND)
        await asyncio.sleep(AFTER_EXIT)
    finally:
        load.stop()
        await sending
        await load.aclose()
    records = load.records
    refusals = ("refused", "connect-refused")
    lost = [r for r in records if r.outcome != "ok" and r.outcome not in refusals]
    return Handover(
        sent=len(records),
        lost=sum(r.done_at < signalled for r in lost),
        refused=sum(r.outcome in refusals and r.done_at < signalled for r in records),
        lost_at_stop=sum(r.done_at >= signalled for r in lost),
        seconds=seconds if kind == "serve" else [],
        problems=sorted({f"{r.kind}: {r.outcome[:80]}" for r in lost}),
        replaced=replaced,
    )


async def _until_gone(process: asyncio.subprocess.Process, workers: set[int], log: Path) -> None:
    """Wait until none of ``workers`` is a worker of the server any more (the reload is over)."""
    deadline = time.monotonic() + BOUND
    while workers & _children(process.pid):
        if process.returncode is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the old workers never left:\n{_tail(log)}")
        await asyncio.sleep(0.05)


def _children(pid: int) -> set[int]:
    """The server's workers: the direct child processes of ``pid``, but for multiprocessing's
    resource tracker (which uvicorn's spawned workers share and a reload keeps)."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            found.update(int(child) for child in (task / "children").read_text().split())
    return {child for child in found if b"resource_tracker" not in _command_line(child)}


def _command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


async def _until_answering(process: asyncio.subprocess.Process, url: str, log: Path) -> None:
    deadline = time.monotonic() + BOUND
    async with httpx.AsyncClient(base_url=url, timeout=2.0, trust_env=False) as probe:
        while True:
            with contextlib.suppress(httpx.TransportError):
                if (await probe.get("/fast")).status_code == 200:
                    return
            if process.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{url} never answered:\n{_tail(log)}")
            await asyncio.sleep(0.1)


async def _until_logged(process: asyncio.subprocess.Process, log: Path, text: str) -> None:
    deadline = time.monotonic() + BOUND
    while text not in await asyncio.to_thread(log.read_text, errors="replace"):
        if process.returncode is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the server never logged {text!r}:\n{_tail(log)}")
        await asyncio.sleep(0.05)


def _tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-15:])


def _missing(kind: str) -> str | None:
    module = SERVERS[kind]
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed (pip install -e '.[bench]'; make bench does)"
    if kind in WORKER_CLASSES and importlib.util.find_spec("gunicorn") is None:
        return "gunicorn is not installed (pip install -e '.[bench]'; make bench does)"
    return None


async def _rounds(kinds: list[str], rounds: int) -> dict[str, list[Handover]]:
    results: dict[str, list[Handover]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="fz-bench-handover-") as workdir:
        for index in range(rounds):
            order = kinds[index % len(kinds) :] + kinds[: index % len(kinds)]
            for kind in order:
                print(f"  round {index + 1}/{rounds}: {kind}", file=sys.stderr, flush=True)
                results[kind].append(await _handover(kind, Path(workdir)))
    return results


def _rows(kind: str, runs: list[Handover]) -> list[dict[str, Any]]:
    name = f"handover.{_LABELS[kind]}, SIGHUP x{RELOADS} + SIGTERM"
    sent = sum(run.sent for run in runs)
    problems = sorted({p for run in runs for p in run.problems})[:3]
    kept = sum(not run.replaced for run in runs)
    note = (
        f"{len(runs)} runs, {sent:,} requests from {KEEP_ALIVE} keep-alive, {SLOW} slow and "
        f"{FRESH} fresh-connection clients on one port"
        + (f"; in {kept} the workers were NOT all replaced" if kept else "; workers replaced")
        + (f"; e.g. {'; '.join(problems)}" if problems else "")
    )
    ours = kind in OURS
    target = "0 every round" if ours else "(comparison)"
    out = [
        row(
            name,
            "lost requests per run, before the SIGTERM",
            "requests",
            [float(run.lost) for run in runs],
            baseline=None,
            ratio=None,
            target=target,
            command=COMMAND,
            ok=all(run.lost == 0 and run.replaced for run in runs) if ours else None,
            note=note,
        ),
        row(
            name,
            "refused requests per run, before the SIGTERM",
            "requests",
            [float(run.refused) for run in runs],
            baseline=None,
            ratio=None,
            target=target,
            command=COMMAND,
            ok=all(run.refused == 0 for run in runs) if ours else None,
        ),
        row(
            name,
            "lost requests per run, at the stop",
            "requests",
            [float(run.lost_at_stop) for run in runs],
            baseline=None,
            ratio=None,
            target=target,
            command=COMMAND,
            ok=all(run.lost_at_stop == 0 for run in runs) if ours else None,
        ),
    ]
    durations = [seconds for run in runs for seconds in run.seconds]
    if durations:
        out.append(
            row(
                name,
                "SIGHUP → old generation gone",
                "s",
                durations,
                baseline=None,
                ratio=None,
                target="(comparison)",
                command=COMMAND,
                note=f"median {statistics.median(durations):.2f} s; most of it is the new "
                "workers importing the app and the old ones' drains",
            )
        )
    return out


def run(quick: bool = False) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    kinds: list[str] = []
    for kind in SERVERS:
        reason = _missing(kind)
        if reason is None:
            kinds.append(kind)
        else:
            rows.append(not_run(f"handover.{_LABELS[kind]}, SIGHUP", reason, COMMAND))
    results = asyncio.run(_rounds(kinds, 1 if quick else 2))
    for kind in kinds:
        rows += _rows(kind, results[kind])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one round")
    print_table(run(parser.parse_args().quick))


if __name__ == "__main__":
    main()
