"""Start and stop real ASGI servers as subprocesses on free loopback ports.

Every wait is bounded; every process is ended by its own PID and waited for; the server's output
goes to a log file the tests read (a pipe could fill up and stall the server).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import httpx

from forgezero_lifecycle.core._httpx import tls_context

__all__ = [
    "GUNICORN_GRACEFUL_TIMEOUT",
    "MORE_SERVER_KINDS",
    "SERVER_KINDS",
    "SERVE_KINDS",
    "RunningServer",
    "free_port",
    "start_server",
    "stop_server",
]

PROJECT_ROOT: Final = Path(__file__).resolve().parents[2]
LIVE_PATH: Final = "/.forgezero/runtime/live"
STARTUP_TIMEOUT: Final = 30.0
SHUTDOWN_TIMEOUT: Final = 10.0

#: ``forgezero-lifecycle serve`` with each of uvicorn's HTTP implementations.
SERVE_KINDS: Final = ("serve-h11", "serve-httptools")
#: The servers every real-server test runs against.
SERVER_KINDS: Final = ("uvicorn-h11", "uvicorn-httptools", "hypercorn")
#: More ways users run an app: hypercorn in one process (``--workers 0``: the app's process takes
#: the signals itself) and gunicorn with one uvicorn worker. ``start_server`` knows them too.
MORE_SERVER_KINDS: Final = ("hypercorn-single", "gunicorn")
#: gunicorn's --graceful-timeout here: how long its master waits for a worker after SIGTERM.
GUNICORN_GRACEFUL_TIMEOUT: Final = 10


#: Where :func:`free_port` hands ports out: below Linux's ephemeral range (32768-60999 by
#: default), which the kernel gives to ``bind(port 0)`` and to every client connection's own end.
#: A port taken from there by one test was seen reused by another test process's server before
#: the first one's server bound it (``[Errno 98]``, and the first test's clients were answered
#: 404 by the other's app), and a client connection of the suite's loads may hold it as its
#: source port. Each pytest-xdist worker (``gwN``) has a block of its own.
PORTS: Final = range(20000, 32000)
_BLOCK: Final = len(PORTS) // 32
#: The next port this process tries, and the lock over it (servers are started from threads).
_next_port: int | None = None
_HANDING_OUT: Final = threading.Lock()


def free_port() -> int:
    """A loopback port nobody listens on right now (the uvicorn CLI cannot bind port 0), from
    this process's block of :data:`PORTS`, in turn: a port comes again only after the whole
    block, and never from another worker's. Servers started side by side could otherwise be
    handed one port, and the one that fails to bind it would look live, since its liveness probe
    reaches the other."""
    global _next_port
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    first = PORTS.start + (int(worker) % 32 if worker.isdigit() else 0) * _BLOCK
    with _HANDING_OUT:
        for _ in range(_BLOCK):
            if _next_port is None:  # apart from another run's worker of the same number
                _next_port = first + os.getpid() % _BLOCK
            port, _next_port = _next_port, first + (_next_port + 1 - first) % _BLOCK
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue  # taken: by another program, or a server of this run still up
            return port
    raise RuntimeError(f"no free port in {first}-{first + _BLOCK - 1}")


def _command(kind: str, target: str, port: int, log_level: str) -> list[str]:
    if kind.startswith("uvicorn-"):
        return [
            sys.executable,
            "-m",
            "uvicorn",
            target,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--http",
            kind.removeprefix("uvicorn-"),
            "--log-level",
            log_level,
            "--no-access-log",
            "--timeout-graceful-shutdown",
            "3",
        ]
    if kind.startswith("serve-"):
        return [
            sys.executable,
            "-m",
            "forgezero_lifecycle",
            "serve",
            target,
            "--port",
            str(port),
            "--http",
            kind.removeprefix("serve-"),
            "--drain-timeout",
            "10s",
            "--log-level",
            log_level,
            "--no-access-log",
        ]
    if kind in ("hypercorn", "hypercorn-single"):
        single = ["--workers", "0"] if kind == "hypercorn-single" else []
        return [
            sys.executable,
            "-m",
            "hypercorn",
            target,
            "--bind",
            f"127.0.0.1:{port}",
            "--error-logfile",
            "-",
            "--log-level",
            log_level,
            "--graceful-timeout",
            "3",
            *single,
        ]
    if kind == "gunicorn":
        return [
            sys.executable,
            "-m",
            "gunicorn",
            target,
            "--worker-class",
            "uvicorn_worker.UvicornWorker",
            "--workers",
            "1",
            "--bind",
            f"127.0.0.1:{port}",
            "--log-level",
            log_level,
            "--graceful-timeout",
            str(GUNICORN_GRACEFUL_TIMEOUT),
            "--no-control-socket",
        ]
    raise ValueError(
        f"unknown server kind {kind!r}; expected one of {SERVER_KINDS + MORE_SERVER_KINDS + SERVE_KINDS}"
    )


@dataclass
class RunningServer:
    """One server process and where to reach it."""

    kind: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_server(
    kind: str,
    target: str,
    *,
    log_path: Path,
    environment: Mapping[str, str],
    log_level: str = "warning",
    extra_args: Sequence[str] = (),
    measured: bool = True,
) -> RunningServer:
    """Start ``target`` (``module:app``) under ``kind``; return once its liveness probe answers.

    ``extra_args`` go to the server's command line after the ones ``kind`` stands for.
    ``measured=False`` keeps coverage out of the process: coverage installs a SIGTERM handler of
    its own in every process it measures, which a test of signal handling must not see."""
    port = free_port()
    env = {**os.environ, **environment}
    if not measured:
        env.pop("COVERAGE_PROCESS_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(PROJECT_ROOT), env.get("PYTHONPATH"))))
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [*_command(kind, target, port, log_level), *extra_args],
            cwd=PROJECT_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    server = RunningServer(kind, f"http://127.0.0.1:{port}", process, log_path)
    try:
        _wait_until_live(server)
    except BaseException:
        stop_server(server)
        raise
    return server


def _wait_until_live(server: RunningServer) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    with httpx.Client(timeout=1.0, verify=tls_context()) as client:
        while True:
            if server.process.poll() is not None:
                raise RuntimeError(
                    f"{server.kind} exited with {server.process.returncode}:\n{server.log()}"
                )
            try:
                if client.get(server.url + LIVE_PATH).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{server.kind} did not answer {LIVE_PATH} within {STARTUP_TIMEOUT} s:\n"
                    f"{server.log()}"
                )
            time.sleep(0.05)


def stop_server(server: RunningServer) -> None:
    """Terminate by PID and wait; kill if it does not stop within the bound."""
    process = server.process
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=SHUTDOWN_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=SHUTDOWN_TIMEOUT)
