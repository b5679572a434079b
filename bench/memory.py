"""Resident memory of the runtime and of the example apps, bare vs with it, idle and under load.

First the runtime alone: ``bench/apps/hello.py``'s Starlette hello with ``Runtime.install``
(no state adapter, no job store) next to the same app without the library, which imports no
pydantic, so the difference is everything the runtime brings. Each run checks that in a fresh
interpreter (the bench stops if the bare app imports pydantic) and says in the note which of the
two big imports each side has loaded once its app is built: pydantic (the runtime loads it on the
first drain request, not before; the examples load it for their own state models, which the
state adapter needs) and httpx (a runtime with a state adapter and a handoff token builds its
loopback fetch transport at start-up, so a handoff does not pay for the import; without a
handoff token the first ``begin`` builds it). Then each example
(``examples/starlette_app``, ``examples/fastapi_app``) runs under uvicorn as it ships, with the
runtime installed, next to ``bench/apps/examples_bare.py``: the same endpoints without anything
of the library; once with the control token only, once with the handoff token too, as the
examples' READMEs run them (the handoff's fetch prepared). Both processes are started together; their ``VmRSS``
(``/proc/<pid>/status``) is read idle (started, no request yet), after 10,000 requests to
``/hello`` and after 10,000 more, sent by ``bench._load``'s Python generator in a separate
process (an exact request count, which ``wrk`` cannot do). Fresh processes every round.

Targets: the runtime costs ≤ 5 MiB over bare, idle and after 10,000 requests, and RSS does not
grow over the second 10,000 (≤ 0.25 MiB, i.e. under 26 bytes per request: any per-request leak of
even one small object would exceed it).

Run ``python -m bench.memory [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from bench._load import run_load
from bench._report import paired, print_table, row
from bench.server import Server, start_servers, stop_servers

__all__ = ["rss_mib", "run"]

_RUNTIME_ALONE: Final = "runtime alone (Starlette hello)"
_CONTROL: Final = {"FORGEZERO_CONTROL_TOKEN": "bench-control-token-0123456789"}
#: As the examples' READMEs run them: with a handoff token, this generation's fetch is prepared.
_HANDOFF: Final = {**_CONTROL, "FORGEZERO_HANDOFF_TOKEN": "b" * 43}
_EXAMPLE_BARE: Final = "bench/apps/examples_bare.py (the library is not even imported)"
#: name: (bare target, our target, what bare is, our environment)
EXAMPLES: Final = {
    _RUNTIME_ALONE: (
        "bench.apps.hello:starlette()",
        "bench.apps.hello:starlette_runtime()",
        "bench/apps/hello.py's Starlette hello",
        _CONTROL,
    ),
    "Starlette example": (
        "bench.apps.examples_bare:starlette()",
        "examples.starlette_app.app:app",
        _EXAMPLE_BARE,
        _CONTROL,
    ),
    "Starlette example, handoff token": (
        "bench.apps.examples_bare:starlette()",
        "examples.starlette_app.app:app",
        _EXAMPLE_BARE,
        _HANDOFF,
    ),
    "FastAPI example": (
        "bench.apps.examples_bare:fastapi()",
        "examples.fastapi_app.app:app",
        _EXAMPLE_BARE,
        _CONTROL,
    ),
    "FastAPI example, handoff token": (
        "bench.apps.examples_bare:fastapi()",
        "examples.fastapi_app.app:app",
        _EXAMPLE_BARE,
        _HANDOFF,
    ),
}
_BIG_IMPORTS: Final = ("pydantic", "httpx")
_BIG: Final = " and ".join(_BIG_IMPORTS)
REQUESTS: Final = 10_000
CONNECTIONS: Final = 16
TARGET_OVER_MIB: Final = 5.0
TARGET_GROWTH_MIB: Final = 0.25


def rss_mib(pid: int) -> float:
    """``VmRSS`` of a process, in MiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def big_imports(target: str, environment: dict[str, str]) -> list[str]:
    """Which of pydantic and httpx building ``target`` (``module:attribute`` or
    ``module:factory()``) imports, checked in a fresh interpreter as the server process builds it.
    """
    module, _, attribute = target.partition(":")
    probe = (
        f"import importlib, sys; app = importlib.import_module({module!r}).{attribute}; "
        f"print(' '.join(m for m in {_BIG_IMPORTS!r} if m in sys.modules))"
    )
    answer = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **environment},
    ).stdout
    return answer.split()


def _load(server: Server) -> None:
    result = run_load(
        server.url + "/hello", seconds=60, connections=CONNECTIONS, requests=REQUESTS, tool="python"
    )
    if result.requests != REQUESTS or result.errors:
        raise RuntimeError(f"{server.target}: {result}")


def _one_round(
    bare: str, ours: str, environment: dict[str, str], log_dir: Path, flip: bool
) -> dict[str, list[float]]:
    """RSS (MiB) idle, after 10,000 and after 20,000 requests, per side."""
    servers = start_servers([bare, ours], log_dir, [{}, environment])
    try:
        time.sleep(1.0)  # let start-up allocations settle
        sides = dict(zip(("bare", "ours"), servers, strict=True))
        order = list(sides.values())[:: -1 if flip else 1]
        readings = {name: [rss_mib(server.pid)] for name, server in sides.items()}
        for _ in range(2):
            for server in order:
                _load(server)
            time.sleep(0.3)
            for name, server in sides.items():
                readings[name].append(rss_mib(server.pid))
        return readings
    finally:
        stop_servers(servers)


def run(quick: bool) -> list[dict[str, Any]]:
    """Rows per example: RSS over bare (idle, after 10,000 requests) and growth over 10,000 more."""
    rounds = 1 if quick else 3
    command = ".venv/bin/python -m bench.memory" + (" --quick" if quick else "")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fz-bench-memory-") as tmp:
        for name, (bare, ours, bare_is, environment) in EXAMPLES.items():
            if quick and name.startswith("FastAPI"):
                continue  # quick mode: the runtime alone and the Starlette example
            loaded = {"bare": big_imports(bare, {}), "ours": big_imports(ours, environment)}
            if name == _RUNTIME_ALONE and "pydantic" in loaded["bare"]:
                raise RuntimeError(f"{bare} imports pydantic: the row would hide what it costs")
            results = [
                _one_round(bare, ours, environment, Path(tmp), i % 2 == 1) for i in range(rounds)
            ]
            big = "; ".join(f"{side} {' + '.join(m) or 'neither'}" for side, m in loaded.items())
            rows += _rows(name, results, rounds, command, f"{bare_is}; loaded of {_BIG}: {big}")
    return rows


def _rows(
    name: str, results: list[dict[str, list[float]]], rounds: int, command: str, bare_is: str
) -> list[dict[str, Any]]:
    def at(side: str, index: int) -> list[float]:
        return [result[side][index] for result in results]

    note = (
        f"uvicorn --http httptools, {rounds} round(s) of fresh processes; {REQUESTS:,} GET /hello "
        f"per step from a Python load generator process, {CONNECTIONS} connections; bare = "
        f"{bare_is}"
    )
    rows = []
    for index, label in ((0, "idle"), (1, f"after {REQUESTS:,} requests")):
        ours, bare = at("ours", index), at("bare", index)
        rows.append(
            row(
                f"memory.{name}",
                f"RSS over bare, {label}",
                "MiB",
                [a - b for a, b in zip(ours, bare, strict=True)],
                baseline=statistics.median(bare),
                ratio=round(statistics.median(paired(ours, bare)), 3),
                target=f"≤ {TARGET_OVER_MIB:g} MiB",
                command=command,
                note=note if index == 0 else "",
            )
        )
    growth = [a - b for a, b in zip(at("ours", 2), at("ours", 1), strict=True)]
    bare_growth = [a - b for a, b in zip(at("bare", 2), at("bare", 1), strict=True)]
    rows.append(
        row(
            f"memory.{name}",
            f"RSS growth over the 2nd {REQUESTS:,} requests",
            "MiB",
            growth,
            baseline=statistics.median(bare_growth),
            ratio=None,
            target=f"≤ {TARGET_GROWTH_MIB:g} MiB",
            command=command,
        )
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one round; the runtime alone and the Starlette example",
    )
    print_table(run(parser.parse_args(argv).quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
