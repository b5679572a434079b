"""Under a foreign multi-worker server a drain reaches one worker: it must never say drained.

``uvicorn --workers 2``, ``hypercorn --workers 2`` and ``gunicorn -w 2`` (with the uvicorn
worker) bind in a parent and accept in two children. The worker that receives a drain request finds its sibling on the listening socket, says so
in the log and in the status ``detail``, and fails the drain instead of reporting ``drained``.
A SIGTERM is different: the parent passes it to every worker, and each drains itself in full.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Final

import httpx
import pytest

from forgezero_lifecycle.core._httpx import tls_context
from tests.cli.conftest import CONTROL_TOKEN, PROJECT_ROOT, free_port

from .conftest import AUTH, alive
from .test_generation_drain import BEGIN, STATUS, _request

pytestmark = pytest.mark.server

BOUND: Final = 30.0


def _command(kind: str, port: int) -> list[str]:
    if kind == "gunicorn-ours":
        return [
            sys.executable, "-m", "gunicorn", "tests.cli.apps:app", "-w", "2",
            "-k", "forgezero_lifecycle.gunicorn.UvicornWorker", "-b", f"127.0.0.1:{port}",
            "--graceful-timeout", "10", "--log-level", "info",
        ]  # fmt: skip
    if kind == "uvicorn":
        return [
            sys.executable, "-m", "uvicorn", "tests.cli.apps:app", "--workers", "2",
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "info",
        ]  # fmt: skip
    if kind == "gunicorn":
        return [
            sys.executable, "-m", "gunicorn", "tests.cli.apps:app", "-w", "2",
            "-k", "uvicorn_worker.UvicornWorker", "-b", f"127.0.0.1:{port}",
            "--log-level", "info",
        ]  # fmt: skip
    return [
        sys.executable, "-m", "hypercorn", "tests.cli.apps:app", "--workers", "2",
        "--bind", f"127.0.0.1:{port}", "--error-logfile", "-", "--log-level", "info",
    ]  # fmt: skip


def _children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[1]) == parent and fields[0] != "Z":
                found.append(int(entry))
    return found


def _workers(parent: int) -> set[int]:
    """The server's workers: its children but multiprocessing's resource tracker."""
    found = set()
    for pid in _children(parent):
        with contextlib.suppress(OSError):
            if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(pid)
    return found


def _get(url: str, **options: object) -> httpx.Response:
    return httpx.get(
        url,
        timeout=5,
        trust_env=False,
        headers={"connection": "close", **AUTH},
        verify=tls_context(),
        **options,
    )


def _start(kind: str, tmp_path: Path) -> tuple[str, Path, subprocess.Popen[bytes]]:
    """The foreign server ``kind`` with two workers on a free port: (url, log, process)."""
    port = free_port()
    log_path = tmp_path / "server.log"
    environment = {**os.environ, "FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN}
    environment["PYTHONPATH"] = str(PROJECT_ROOT)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            _command(kind, port),
            cwd=PROJECT_ROOT,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return f"http://127.0.0.1:{port}", log_path, process


@pytest.mark.parametrize("kind", ["uvicorn", "hypercorn", "gunicorn", "gunicorn-ours"])
def test_one_worker_drain_refused(kind: str, tmp_path: Path) -> None:
    """A drain request lands on one worker of several: refused with a 409 before intake closes,
    naming ``serve --workers`` and the worker class; every worker still serves, and status and
    rollback answer the same from any of them."""
    url, log_path, process = _start(kind, tmp_path)
    seen: set[int] = set()
    try:
        _wait_serving(process, url, log_path, seen)
        request = _request()
        begun = httpx.post(
            url + BEGIN,
            json=request,
            headers=AUTH,
            timeout=5,
            trust_env=False,
            verify=tls_context(),
        )
        assert begun.status_code == 409, begun.text
        refusal = begun.json()
        assert refusal["error"] == "RUNTIME_DRAIN_SHARED_LISTENER"
        assert "serve APP --workers N" in refusal["detail"]
        assert "forgezero_lifecycle.gunicorn.UvicornWorker" in refusal["detail"]
        ready = [_get(url + "/.forgezero/runtime/ready").status_code for _ in range(20)]
        assert ready == [200] * 20
        served = [_get(url + "/fast").status_code for _ in range(20)]
        assert served == [200] * 20
        for _ in range(6):  # new connections: the kernel hands them to any worker
            status = _get(url + STATUS, params={"nonce": request["nonce"]})
            assert status.json()["error"] == "RUNTIME_DRAIN_NOT_FOUND"
        assert "drain.refused_partial" in log_path.read_text()
    finally:
        survivors = _end(process, seen, signal.SIGINT if kind == "hypercorn" else signal.SIGTERM)
    assert survivors == []


@pytest.mark.parametrize("kind", ["uvicorn", "gunicorn"])
def test_sigterm_drains_every_worker(kind: str, tmp_path: Path) -> None:
    """SIGTERM reaches every foreign worker and each drains in full: a signal is not a partial
    drain, the parent passes it to every worker."""
    url, log_path, process = _start(kind, tmp_path)
    seen: set[int] = set()
    try:
        _wait_serving(process, url, log_path, seen)
        slow: list[int] = []
        thread = threading.Thread(
            target=lambda: slow.append(_get(url + "/slow?seconds=1.5").status_code), daemon=True
        )
        thread.start()
        time.sleep(0.5)  # the slow request is admitted
        process.send_signal(signal.SIGTERM)
        process.wait(BOUND)
        thread.join(BOUND)
        text = log_path.read_text()
        assert slow == [200]
        assert "drain.refused_partial" not in text  # (the library logs errors unconfigured)
        assert "state=failed" not in text
    finally:
        survivors = _end(process, seen, signal.SIGTERM)
    assert survivors == []


def _wait_serving(
    process: subprocess.Popen[bytes], url: str, log_path: Path, seen: set[int]
) -> None:
    deadline = time.monotonic() + BOUND
    while True:
        seen.update(_children(process.pid))
        try:
            if len(seen) >= 2 and _get(url + "/.forgezero/runtime/live").status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert process.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.1)
    time.sleep(1.0)  # both children serving (the second may still be importing the app)


def _end(process: subprocess.Popen[bytes], seen: set[int], signum: int) -> list[int]:
    """Stop the server by its PID, then make sure none of its workers is left (killed now)."""
    if process.poll() is None:
        process.send_signal(signum)
        try:
            process.wait(BOUND)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(BOUND)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [pid for pid in seen if alive(pid)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    return survivors


def test_gunicorn_short_timeout_warns(tmp_path: Path) -> None:
    """``--graceful-timeout 10`` under a 30 s drain deadline: the arbiter's first worker says
    what it needs, once for the two workers."""
    warning = "gunicorn.graceful_timeout_too_short graceful_timeout=10 needed=39"
    url, log_path, process = _start("gunicorn-ours", tmp_path)
    seen: set[int] = set()
    try:
        _wait_serving(process, url, log_path, seen)
        deadline = time.monotonic() + 15
        while warning not in log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)  # a file: the first worker may check after its sibling serves
        assert "set --graceful-timeout to at least 39" in log_path.read_text()
    finally:
        survivors = _end(process, seen, signal.SIGTERM)
    assert survivors == []
    assert log_path.read_text().count(warning) == 1  # both workers have booted and stopped
