"""Does ``serve --workers 2`` serve twice what ``--workers 1`` does, on a CPU-bound app?

Each server is started anew for every round; the load (50 keep-alive connections, one request
outstanding on each) begins the moment ``/work`` first answers 200, so the connections are made
while the server may still be starting its workers: a supervisor that lets the first ready worker
take them all serves one worker's worth however many it has (issue 23, row 12). The app spends
about 1 ms of CPU per request (``bench/apps/cpu.py``). ``uvicorn --workers 2`` runs beside it in
the same rounds, for comparison. The figure is requests/s; the row's ratio is ``--workers 2``
over ``--workers 1`` (target ≥ 1.8). On a shared 2-core machine the load generator takes a
share of the same cores, which caps what any server can show.

Run ``python -m bench.scaling [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import httpx

from bench._load import loader_name, run_load
from bench._report import print_table, row

__all__ = ["run"]

PROJECT_ROOT: Final = Path(__file__).resolve().parents[1]
CONNECTIONS: Final = 50
TARGET: Final = "bench.apps.cpu:app"
COMMAND: Final = ".venv/bin/python -m bench.scaling"
STARTUP_TIMEOUT: Final = 60.0
KINDS: Final = ("serve-1", "serve-2", "uvicorn-2")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _command(kind: str, port: int) -> list[str]:
    if kind.startswith("serve"):
        workers = kind.split("-")[1]
        return [
            sys.executable, "-m", "forgezero_lifecycle", "serve", TARGET, "--port", str(port),
            "--workers", workers, "--no-access-log", "--insecure-loopback-control",
        ]  # fmt: skip
    return [
        sys.executable, "-m", "uvicorn", TARGET, "--port", str(port), "--workers", "2",
        "--no-access-log", "--log-level", "warning", "--http", "httptools",
    ]  # fmt: skip


def _first_200(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited {process.returncode}")
        try:
            if httpx.get(url, timeout=5.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.01)
    raise RuntimeError("the server did not answer in time")


def _one(kind: str, seconds: float, log_dir: Path) -> float:
    port = _free_port()
    url = f"http://127.0.0.1:{port}/work"
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    with (log_dir / f"{kind}-{port}.log").open("wb") as log:
        process = subprocess.Popen(
            _command(kind, port), cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _first_200(url, process)
        result = run_load(url, seconds=seconds, connections=CONNECTIONS)
        return result.rps
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def run(quick: bool = False) -> list[dict[str, Any]]:
    rounds, seconds = (1, 3.0) if quick else (3, 8.0)
    found: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as directory:
        for number in range(rounds):
            order = KINDS[number % len(KINDS) :] + KINDS[: number % len(KINDS)]
            for kind in order:
                found[kind].append(_one(kind, seconds, Path(directory)))
    one, two, peer = (statistics.median(found[kind]) for kind in KINDS)
    note = (
        f"{rounds} rounds of {seconds:g} s, {CONNECTIONS} keep-alive connections made at the "
        f"first 200, ~1 ms CPU per request; load: {loader_name()}; requests/s per round: "
        + ", ".join(f"{kind} {[round(x) for x in found[kind]]}" for kind in KINDS)
    )
    return [
        row(
            "scaling, serve --workers 2 / --workers 1",
            "requests/s",
            "req/s",
            found["serve-2"],
            baseline=one,
            ratio=two / one,
            target="ratio ≥ 1.8",
            command=COMMAND,
            ok=two / one >= 1.8,
            note=note,
        ),
        row(
            "scaling, uvicorn --workers 2 / serve --workers 1",
            "requests/s",
            "req/s",
            found["uvicorn-2"],
            baseline=one,
            ratio=peer / one,
            target="(comparison)",
            command=COMMAND,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    print_table(run(args.quick))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
