"""Fixtures of the CLI tests: ``forgezero-lifecycle serve`` processes on free loopback ports.

Every process is started by the test that needs it and ended by its own PID in a finalizer
(SIGTERM, then SIGKILL after a bound). Output goes to a log file, never to a pipe nobody reads.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from forgezero_lifecycle.core._httpx import tls_context
from tests.real_servers._servers import free_port

PROJECT_ROOT: Final = Path(__file__).resolve().parents[2]
CONTROL_TOKEN: Final = "cli-tests-control-token-0123456789abcdef"
#: 43 base64url characters: the only form a handoff request may carry.
HANDOFF_TOKEN: Final = "cli-tests-handoff-token-0123456789abcdefghi"
REVISION_A: Final = hashlib.sha1(b"cli tests generation A").hexdigest()
REVISION_B: Final = hashlib.sha1(b"cli tests generation B").hexdigest()
BOUND: Final = 20.0


def popen_logged(
    command: Sequence[str], env: dict[str, str], log_path: Path, pass_fds: Sequence[int] = ()
) -> subprocess.Popen[bytes]:
    """``command`` started in the project root, its output to ``log_path`` (a pipe nobody reads
    could fill up and stall it)."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            command,
            cwd=PROJECT_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=pass_fds,
        )


@dataclass
class Served:
    """One ``serve`` process and where to reach it."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    threads: list[threading.Thread] = field(default_factory=list)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str, **options: Any) -> httpx.Response:
        return httpx.get(
            self.url + path, timeout=BOUND, trust_env=False, verify=tls_context(), **options
        )

    def counters(self) -> dict[str, Any]:
        result: dict[str, Any] = self.get("/_test/counters").json()
        return result

    def in_background(self, path: str) -> list[httpx.Response | BaseException]:
        """GET ``path`` on a thread; the list receives the response (or the error)."""
        outcome: list[httpx.Response | BaseException] = []

        def call() -> None:
            try:
                outcome.append(self.get(path))
            except BaseException as error:
                outcome.append(error)

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        self.threads.append(thread)
        return outcome

    def wait_for(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + BOUND
        while not done():
            assert time.monotonic() < deadline, f"not {what} within {BOUND} s:\n{self.log()}"
            time.sleep(0.02)

    def wait_admitted(self, count: int = 1) -> None:
        self.wait_for(lambda: self.counters()["http"] >= count, "admitted")

    def join(self) -> None:
        for thread in self.threads:
            thread.join(BOUND)

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.process.send_signal(signum)

    def wait_exit(self, bound: float = BOUND) -> int:
        return self.process.wait(timeout=bound)


def _stop(served: Served) -> None:
    if served.process.poll() is None:
        served.process.terminate()
        try:
            served.process.wait(timeout=BOUND)
        except subprocess.TimeoutExpired:
            served.process.kill()
            served.process.wait(timeout=BOUND)
    served.join()


StartServe = Callable[..., Served]


@pytest.fixture
def start_serve(tmp_path: Path) -> Iterator[StartServe]:
    """Start ``forgezero-lifecycle serve TARGET`` and return once it is live."""
    started: list[Served] = []

    def start(
        target: str = "tests.cli.apps:app",
        *flags: str,
        revision: str = REVISION_A,
        env: dict[str, str] | None = None,
    ) -> Served:
        port = free_port()
        command: Sequence[str] = [
            sys.executable, "-m", "forgezero_lifecycle", "serve", target,
            "--port", str(port), "--revision", revision,
            "--log-level", "info", "--no-access-log", *flags,
        ]  # fmt: skip
        log_path = tmp_path / f"serve-{port}.log"
        environment = {
            **os.environ,
            "FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN,
            "FORGEZERO_HANDOFF_TOKEN": HANDOFF_TOKEN,
            **(env or {}),
        }
        process = popen_logged(command, environment, log_path)
        served = Served(f"http://127.0.0.1:{port}", process, log_path)
        started.append(served)
        deadline = time.monotonic() + BOUND
        while True:
            assert process.poll() is None, f"serve exited {process.returncode}:\n{served.log()}"
            try:
                if served.get("/.forgezero/runtime/live").status_code == 200:
                    return served
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"serve was not live in {BOUND} s:\n{served.log()}"
            time.sleep(0.05)

    try:
        yield start
    finally:
        for served in started:
            _stop(served)
