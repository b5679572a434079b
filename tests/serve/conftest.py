"""Fixtures of the ``serve`` tests: the CLI tests' ``start_serve`` and the reliability tests'
``sqlite_jobs`` (shared), and for
``serve --workers`` a supervisor process and every worker it starts.

The supervisor is started by the test; its workers are found through ``/proc`` (children of the
supervisor's PID running ``forgezero_lifecycle.serve.worker``, and with ``--preload`` the
children of its preload processes, which run ``forgezero_lifecycle.serve.preload``). The
finalizer stops the supervisor by PID (SIGTERM, then SIGKILL after a bound), then checks every
worker and preload PID ever seen: one still running after the bound is killed and fails the
test — no process of the supervisor's survives a test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from forgezero_lifecycle.core._httpx import tls_context
from tests.cli.conftest import CONTROL_TOKEN, free_port, popen_logged, start_serve
from tests.reliability.conftest import sqlite_jobs

__all__ = ["sqlite_jobs", "start_serve", "start_supervised"]

BOUND: Final = 30.0
WORKER_MODULE: Final = "forgezero_lifecycle.serve.worker"
#: The command line of a preload process, and of every worker forked from it.
PRELOAD_MODULE: Final = "forgezero_lifecycle.serve.preload"
AUTH: Final = {"Authorization": f"Bearer {CONTROL_TOKEN}"}


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _runs(pid: int, module: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return module.encode() in cmdline


def _is_ours(pid: int) -> bool:
    """A worker, spawned or forked, or a preload process."""
    return _runs(pid, WORKER_MODULE) or _runs(pid, PRELOAD_MODULE)


def alive(pid: int) -> bool:
    """Running (a zombie is not) and still a worker or supervisor of ours."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _live_children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields and fields[0] != "Z" and int(fields[1]) == parent:
                found.append(int(entry))
    return found


def preloads(parent: int) -> list[int]:
    """Live preload processes (``--preload``) whose parent is ``parent``."""
    return sorted(pid for pid in _live_children(parent) if _runs(pid, PRELOAD_MODULE))


def children(parent: int) -> list[int]:
    """Live worker processes of the supervisor ``parent``: spawned by it, or forked by one of
    its preload processes."""
    spawned = [pid for pid in _live_children(parent) if _runs(pid, WORKER_MODULE)]
    forked = [pid for preload in preloads(parent) for pid in _live_children(preload)]
    return sorted(spawned + forked)


@dataclass
class Supervised:
    """One ``serve --workers`` process, its port, its records and the workers seen so far."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    records: Path
    seen: set[int] = field(default_factory=set)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def workers(self) -> list[int]:
        found = children(self.process.pid)
        self.seen.update(found, preloads(self.process.pid))
        return found

    def wait_for(self, done: Callable[[], Any], what: str, bound: float = BOUND) -> Any:
        deadline = time.monotonic() + bound
        while not (result := done()):
            assert time.monotonic() < deadline, f"not {what} within {bound} s:\n{self.log()}"
            time.sleep(0.05)
        return result

    def wait_log(self, text: str, bound: float = BOUND) -> None:
        self.wait_for(lambda: text in self.log(), f"logged {text!r}", bound)

    def get(self, path: str, **options: Any) -> httpx.Response:
        """A request on a new connection, so the kernel may hand it to any worker."""
        headers = {"connection": "close", **options.pop("headers", {})}
        return httpx.get(
            self.url + path,
            timeout=BOUND,
            trust_env=False,
            headers=headers,
            verify=tls_context(),
            **options,
        )

    def post(self, path: str, body: object) -> httpx.Response:
        return httpx.post(
            self.url + path,
            json=body,
            headers=AUTH,
            timeout=BOUND,
            trust_env=False,
            verify=tls_context(),
        )

    def worker_records(self) -> dict[int, list[str]]:
        """Each worker's record lines (times dropped), by PID."""
        found: dict[int, list[str]] = {}
        for path in self.records.glob("*.log"):
            lines = path.read_text().splitlines()
            found[int(path.stem)] = [line.rsplit(" ", 1)[0] for line in lines]
        return found

    def pids_answering(self, count: int, bound: float = BOUND) -> set[int]:
        """Send /pid until ``count`` distinct workers answered (bounded)."""
        pids: set[int] = set()
        deadline = time.monotonic() + bound
        while len(pids) < count:
            assert time.monotonic() < deadline, f"only {pids} answered:\n{self.log()}"
            pids.add(self.get("/pid").json()["pid"])
        return pids

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait_exit(self, bound: float = BOUND) -> int:
        return self.process.wait(timeout=bound)


def _stop(served: Supervised) -> list[int]:
    """Stop the supervisor; returns the worker PIDs that survived it (killed now)."""
    if served.process.poll() is None:
        served.workers()
        served.process.terminate()
        try:
            served.process.wait(timeout=BOUND)
        except subprocess.TimeoutExpired:
            served.process.kill()
            served.process.wait(timeout=BOUND)
    deadline = time.monotonic() + 10.0
    while any(alive(pid) and _is_ours(pid) for pid in served.seen):
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    survivors = [pid for pid in served.seen if alive(pid) and _is_ours(pid)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    return survivors


StartSupervised = Callable[..., Supervised]


@pytest.fixture
def start_supervised(tmp_path: Path) -> Iterator[StartSupervised]:
    """Start ``serve tests.serve.apps:app --workers N``; return once every worker is ready."""
    started: list[Supervised] = []

    def start(
        *flags: str,
        workers: int = 2,
        target: str = "tests.serve.apps:app",
        env: dict[str, str] | None = None,
        wait: bool = True,
        socket_activation: socket.socket | None = None,
        module: str = "forgezero_lifecycle",
    ) -> Supervised:
        """``socket_activation``: pass this listening socket as fd 3 with ``LISTEN_FDS=1``
        (``workers=0``: plain ``serve``, no supervisor); ``module``: the command line run
        with ``python -m`` (tests/serve/faulty_supervisor.py injects a fault first)."""
        port = free_port()
        records = tmp_path / f"records-{port}"
        records.mkdir()
        command: Sequence[str] = [
            sys.executable, "-m", module, "serve", target,
            "--port", str(port), "--no-access-log", *flags,
            *(("--workers", str(workers)) if workers else ()),
        ]  # fmt: skip
        log_path = tmp_path / f"supervisor-{port}.log"
        environment = {
            **os.environ,
            "FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN,
            "FZW_RECORDS": str(records),
            **(env or {}),
        }
        pass_fds: tuple[int, ...] = ()
        if socket_activation is not None:
            fd = socket_activation.fileno()
            pass_fds = (fd,)
            port = socket_activation.getsockname()[1]
            # What systemd does: the socket at fd 3, LISTEN_PID naming the process after exec.
            script = (
                f"import os, sys; {fd} == 3 or (os.dup2({fd}, 3), os.close({fd})); os.environ.update("
                "LISTEN_PID=str(os.getpid()), LISTEN_FDS='1', LISTEN_FDNAMES='http'); "
                "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
            )
            command = [sys.executable, "-c", script, *command[1:]]
        process = popen_logged(command, environment, log_path, pass_fds)
        served = Supervised(f"http://127.0.0.1:{port}", process, log_path, records)
        started.append(served)
        if wait:
            served.wait_for(
                lambda: "supervisor.serving" in served.log() or process.poll() is not None,
                "serving",
            )
            assert process.poll() is None, f"serve exited {process.returncode}:\n{served.log()}"
            assert len(served.workers()) == workers, served.log()
        return served

    survivors: list[int] = []
    try:
        yield start
    finally:
        for served in started:
            survivors.extend(_stop(served))
    assert survivors == [], f"worker processes survived their supervisor: {survivors}"
