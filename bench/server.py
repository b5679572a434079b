"""Throughput and p99 latency under a real server: bare app vs the same app with the runtime.

Each app family (a raw ASGI hello app, a Starlette endpoint, a FastAPI endpoint; see
``bench/apps/hello.py``) is served by uvicorn (httptools, one worker, default event loop), bare
and with the runtime installed, every variant in its own process, all started once and kept up.
Then, round after round, each variant gets the same load in turn (the order rotates every round)
from a separate process on 127.0.0.1: ``wrk -t1`` when installed, else ``bench._load``'s Python
generator (the notes say which ran). The figure is the median of the per-round paired ratios
runtime / bare, since single rounds on a shared 2-core machine vary by ±20 %. Each run also
reads the server's own CPU time (``/proc/<pid>/task/*/schedstat``), so the rows show CPU µs per
request too: the same overhead, far less disturbed by whatever else the machine runs.

Targets: ≥ 0.97 of bare requests/s on the raw and Starlette apps, ≥ 0.99 on FastAPI, and p99
latency within 5 % of bare. The raw family also runs the smallest possible pure-ASGI counting
middleware, the floor any in-flight counter pays, for comparison.

This module also holds the process helpers the other real-server benchmarks use
(:func:`start_servers`, :func:`stop_servers`). Run ``python -m bench.server [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from bench._load import LoadResult, loader_name, run_load
from bench._report import paired, print_table, row

__all__ = ["Server", "cpu_ns", "run", "start_servers", "stop_servers"]

PROJECT_ROOT: Final = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT: Final = 30.0
STOP_TIMEOUT: Final = 10.0
CONNECTIONS: Final = 32
PATH: Final = "/hello"


# -- server processes ---------------------------------------------------------------------------


@dataclass
class Server:
    """One uvicorn process serving ``target`` on a loopback port."""

    target: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _spawn(
    target: str,
    environment: Mapping[str, str],
    log_dir: Path,
    wrapper: Sequence[str] = (),
    cli_module: str = "uvicorn",
) -> Server:
    port = _free_port()
    env = {**os.environ, **environment}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(PROJECT_ROOT), env.get("PYTHONPATH"))))
    factory = target.endswith("()")
    command = [*wrapper, sys.executable, "-m", cli_module, target.removesuffix("()")]
    command += ["--host", "127.0.0.1"]
    command += ["--port", str(port), "--http", "httptools", "--workers", "1"]
    command += ["--log-level", "warning", "--no-access-log", *(["--factory"] if factory else [])]
    log_path = log_dir / f"{target.strip('()').replace(':', '-')}-{port}.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command,
            cwd=PROJECT_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    return Server(target, f"http://127.0.0.1:{port}", process, log_path)


def _wait_listening(server: Server, deadline: float) -> None:
    """Wait until the port accepts a connection (no HTTP request is made: RSS stays idle)."""
    port = int(server.url.rsplit(":", 1)[1])
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.target} exited:\n{server.log()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{server.target} did not listen in time:\n{server.log()}")
        time.sleep(0.05)


def start_servers(
    targets: Sequence[str],
    log_dir: Path,
    environment: Sequence[Mapping[str, str]] = (),
    *,
    wrapper: Sequence[str] = (),
    startup_timeout: float = STARTUP_TIMEOUT,
    cli_module: str = "uvicorn",
) -> list[Server]:
    """Start one uvicorn per target at once; return when all listen (or stop all and raise).

    A target is ``module:attribute``; ``module:factory()`` is served with ``--factory``.
    ``wrapper`` is a command the server runs under, ``cli_module`` the module run as uvicorn's
    command line (both for ``bench.instructions``).
    """
    servers: list[Server] = []
    try:
        for index, target in enumerate(targets):
            env = environment[index] if index < len(environment) else {}
            servers.append(_spawn(target, env, log_dir, wrapper, cli_module))
        deadline = time.monotonic() + startup_timeout
        for server in servers:
            _wait_listening(server, deadline)
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers: Sequence[Server], timeout: float = STOP_TIMEOUT) -> None:
    """Terminate each process by its own PID and wait; kill one that does not stop in time."""
    for server in servers:
        if server.process.poll() is None:
            server.process.terminate()
    for server in servers:
        try:
            server.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(timeout=STOP_TIMEOUT)


# -- throughput ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """An app served bare and by its contenders; ``target`` is the minimum requests/s ratio."""

    name: str
    bare: str
    contenders: Mapping[str, str]
    target: float
    references: frozenset[str] = field(default_factory=frozenset)


FAMILIES: Final = (
    Family(
        "raw ASGI hello",
        "bench.apps.hello:raw()",
        {
            "runtime": "bench.apps.hello:raw_runtime()",
            "counting": "bench.apps.hello:raw_counting()",
        },
        0.97,
        frozenset({"counting"}),
    ),
    Family(
        "Starlette hello",
        "bench.apps.hello:starlette()",
        {"runtime": "bench.apps.hello:starlette_runtime()"},
        0.97,
    ),
    Family(
        "FastAPI hello",
        "bench.apps.hello:fastapi()",
        {"runtime": "bench.apps.hello:fastapi_runtime()"},
        0.99,
    ),
)
LATENCY_TARGET: Final = 1.05


def cpu_ns(pid: int) -> int:
    """CPU time a process has run so far, all threads, in ns (``/proc/<pid>/task/*/schedstat``)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total


@dataclass(frozen=True)
class Sample:
    """One variant's load run in one round, with the server's CPU time per request."""

    load: LoadResult
    cpu_us: float


def _measure(
    family: Family, labels: list[str], rounds: int, seconds: float, log_dir: Path
) -> dict[str, list[Sample]]:
    targets = [family.bare if label == "bare" else family.contenders[label] for label in labels]
    servers = dict(zip(labels, start_servers(targets, log_dir), strict=True))
    try:
        for server in servers.values():  # warm up: imports, caches, first connections
            run_load(server.url + PATH, seconds=1, connections=CONNECTIONS)
        results: dict[str, list[Sample]] = {label: [] for label in labels}
        for index in range(rounds):
            shift = index % len(labels)
            for label in labels[shift:] + labels[:shift]:
                server = servers[label]
                before = cpu_ns(server.pid)
                load = run_load(server.url + PATH, seconds=seconds, connections=CONNECTIONS)
                used = cpu_ns(server.pid) - before
                results[label].append(Sample(load, used / 1000 / max(1, load.requests)))
        return results
    finally:
        stop_servers(list(servers.values()))


def _family_rows(
    family: Family, results: dict[str, list[Sample]], note: str, command: str
) -> list[dict[str, Any]]:
    bare = results.pop("bare")
    bare_rps = [r.load.rps for r in bare]
    bare_p99 = [r.load.p99_ms for r in bare]
    bare_cpu = [r.cpu_us for r in bare]
    rows = []
    for label, series in results.items():
        reference = label in family.references
        rps = paired([r.load.rps for r in series], bare_rps)
        p99 = paired([r.load.p99_ms for r in series], bare_p99)
        cpu = paired([r.cpu_us for r in series], bare_cpu)
        errors = sum(r.load.errors for r in series) + sum(r.load.errors for r in bare)
        spread = f"per-round ratios {min(rps):.3f} to {max(rps):.3f}"
        extra = f"; {errors} errors" if errors else ""
        name = f"server.{family.name} +{label}"
        rows += [
            row(
                name,
                "requests/s",
                "req/s",
                [r.load.rps for r in series],
                baseline=statistics.median(bare_rps),
                ratio=round(statistics.median(rps), 3),
                target="(comparison)" if reference else f"ratio ≥ {family.target}",
                command=command,
                ok=None if reference else statistics.median(rps) >= family.target and not errors,
                note=f"{note}; {spread}{extra}",
            ),
            row(
                name,
                "p99 latency",
                "ms",
                [r.load.p99_ms for r in series],
                baseline=statistics.median(bare_p99),
                ratio=round(statistics.median(p99), 3),
                target="(comparison)" if reference else f"ratio ≤ {LATENCY_TARGET}",
                command=command,
                ok=None if reference else statistics.median(p99) <= LATENCY_TARGET,
            ),
            row(
                name,
                "server CPU per request",
                "µs",
                [r.cpu_us for r in series],
                baseline=statistics.median(bare_cpu),
                ratio=round(statistics.median(cpu), 3),
                target="(comparison)",
                command=command,
                note=(
                    "the server process's own CPU time (schedstat) per response: the same "
                    "overhead as requests/s, but far less disturbed by other load on the machine"
                    if label == "runtime" and family is FAMILIES[0]
                    else ""
                ),
            ),
        ]
    return rows


def run(quick: bool) -> list[dict[str, Any]]:
    """Rows of requests/s and p99 latency per app family and contender, paired with bare."""
    rounds, seconds = (5, 1.0) if quick else (30, 1.0)
    command = ".venv/bin/python -m bench.server" + (" --quick" if quick else "")
    note = (
        f"uvicorn --http httptools --workers 1 (event loop: uvicorn's auto, uvloop when installed); "
        f"load: {loader_name()}, {CONNECTIONS} connections, "
        f"{rounds} rounds x {seconds:g} s per variant, order rotated each round"
    )
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fz-bench-server-") as tmp:
        for family in FAMILIES:
            if quick and family.name.startswith("Starlette"):
                continue  # quick mode: the two targets of the issue only
            labels = ["bare", *(c for c in family.contenders if not (quick and c == "counting"))]
            results = _measure(family, labels, rounds, seconds, Path(tmp))
            rows += _family_rows(family, results, note, command)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="5 rounds of 1 s, two families")
    print_table(run(parser.parse_args(argv).quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
