"""Worker recycling under load: ``serve --workers 2 --max-requests 1000``, with and without
``--preload``, against the same server recycling nothing, next to gunicorn ``--max-requests``,
uvicorn ``--limit-max-requests`` and granian ``--workers-lifetime``.

One host, one port, no router: the HTTP load of ``bench._load`` (``wrk -t1`` when installed:
``CLIENTS`` keep-alive connections, one request outstanding on each, to the demo app's
``/fast``) goes to the one port of a server with two worker processes for ``LOAD`` seconds, and
the server recycles its workers as its own flag says:

* ``forgezero-lifecycle serve --workers 2 --preload --max-requests 1000``: a worker past its
  limit is replaced one at a time (the new worker, forked from the generation's preload
  process, accepts before the old one stops accepting, hands its clients over and drains); the
  baseline is the same command without ``--max-requests``;
* the same without ``--preload`` (each new worker starts Python and imports the app), against
  ``serve --workers 2``;
* gunicorn ``-w 2 -k uvicorn_worker.UvicornWorker --max-requests 1000``;
* ``uvicorn --workers 2 --limit-max-requests 1000``;
* granian ``--workers 2 --workers-lifetime 60`` (its shortest: a lifetime, not a request
  count), so its run lasts ``GRANIAN_LOAD`` seconds.

The load generator sends no request twice: a request that got no answer (a connection closed
under it, reset or refused) or an answer other than 2xx (a 503 refusal included) counts as
*failed* (wrk's socket errors and non-2xx responses). Rounds alternate the order of the
servers; the recycled workers are counted from ``serve``'s log, and from the peers' child
processes. Targets: ``serve --preload`` recycling keeps at least 0.9 of the requests a second
it serves without recycling (the per-round ratio, both measured side by side), and no ``serve``
run loses anything. The peers promise nothing:
their rows are comparisons; a peer that is not installed (``pip install -e '.[bench]'``;
``make bench`` does) is a row saying so.

Run ``python -m bench.recycling [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bench._load import loader_name, run_load
from bench._report import not_run, paired, print_table, row
from bench.handover import (
    WORKER_CLASSES,
    _children,
    _missing,
    _tail,
    _until_answering,
    server_process,
)
from forgezero_lifecycle.demo.processes import free_port

__all__ = ["run"]

APP: Final = "forgezero_lifecycle.demo.app:app"
CLIENTS: Final = 16
#: Seconds of load per run (granian's shortest lifetime is 60 s: its run is longer).
LOAD: Final = 20.0
GRANIAN_LOAD: Final = 75.0
MAX_REQUESTS: Final = 1000
COMMAND: Final = ".venv/bin/python -m bench.recycling"
#: How often the worker processes are looked at (to count the recycled ones).
LOOK: Final = 0.25
#: Each run: the server it starts (as in bench.handover) and its recycling flags.
SERVERS: Final = {
    "serve-none": "serve",
    "serve": "serve",
    "serve-preload-none": "serve",
    "serve-preload": "serve",
    "gunicorn": "gunicorn",
    "uvicorn": "uvicorn",
    "granian": "granian",
}
_LABELS: Final = {
    "serve-none": "forgezero-lifecycle serve --workers 2, no recycling",
    "serve": f"forgezero-lifecycle serve --workers 2 --max-requests {MAX_REQUESTS}",
    "serve-preload-none": "forgezero-lifecycle serve --workers 2 --preload, no recycling",
    "serve-preload": (
        f"forgezero-lifecycle serve --workers 2 --preload --max-requests {MAX_REQUESTS}"
    ),
    "gunicorn": f"gunicorn -w 2 (UvicornWorker) --max-requests {MAX_REQUESTS}",
    "uvicorn": f"uvicorn --workers 2 --limit-max-requests {MAX_REQUESTS}",
    "granian": "granian --workers 2 --workers-lifetime 60",
}


#: The row with the target, and each row's baseline where it is not ``serve-none``.
TARGETED: Final = "serve-preload"
_BASELINES: Final = {"serve-preload": "serve-preload-none"}
_BASELINE_LABELS: Final = {
    "serve-none": "serve, no recycling",
    "serve-preload-none": "serve --preload, no recycling",
}


@dataclass
class Run:
    """What the load on the one port saw while the server recycled its workers."""

    sent: int
    per_second: float
    failed: int
    #: Worker processes that were not there at the start (each a recycled worker's successor).
    recycled: int
    seconds: float


def _command(kind: str, port: int) -> list[str]:
    where = ["--host", "127.0.0.1", "--port", str(port)]
    if kind.startswith("serve"):
        recycling = [] if kind.endswith("-none") else ["--max-requests", str(MAX_REQUESTS)]
        preload = ["--preload"] if kind.startswith("serve-preload") else []
        return [
            sys.executable, "-m", "forgezero_lifecycle", "serve", APP, "--workers", "2", *where,
            "--drain-timeout", "5s", "--log-level", "info", "--no-access-log", *recycling,
            *preload,
        ]  # fmt: skip
    if kind == "gunicorn":
        return [
            sys.executable, "-m", "gunicorn", APP, "-w", "2",
            "-k", WORKER_CLASSES["gunicorn"], "-b", f"127.0.0.1:{port}",
            "--graceful-timeout", "20", "--log-level", "warning", "--keep-alive", "5",
            "--max-requests", str(MAX_REQUESTS),
        ]  # fmt: skip
    if kind == "granian":
        return [
            sys.executable, "-m", "granian", "--interface", "asgi", "--workers", "2", *where,
            "--log-level", "warning", "--workers-lifetime", "60", APP,
        ]  # fmt: skip
    return [
        sys.executable, "-m", "uvicorn", APP, "--workers", "2", *where,
        "--log-level", "warning", "--timeout-graceful-shutdown", "20",
        "--limit-max-requests", str(MAX_REQUESTS),
    ]  # fmt: skip


async def _run(kind: str, workdir: Path, seconds: float) -> Run:
    """One server under the load for ``seconds`` (stopped, its process group killed, before
    this returns)."""
    port = free_port()
    log_path = workdir / f"{kind}.log"
    env = {
        **os.environ,
        "FORGEZERO_CONTROL_TOKEN": secrets.token_urlsafe(32),
        "FORGEZERO_DEMO_GENERATION": "R",
    }
    async with server_process(_command(kind, port), env, log_path) as process:
        url = f"http://127.0.0.1:{port}"
        await _until_answering(process, url, log_path)
        workers = seen = _children(process.pid)
        load = asyncio.ensure_future(
            asyncio.to_thread(run_load, url + "/fast", seconds=seconds, connections=CLIENTS)
        )
        while not load.done():
            await asyncio.wait({load}, timeout=LOOK)
            seen = seen | _children(process.pid)
        result = load.result()
        if process.returncode is not None:
            raise RuntimeError(f"{kind} exited {process.returncode}:\n{_tail(log_path)}")
        recycled = len(seen - workers)
        if kind.startswith("serve"):
            # Its own count: a worker forked with --preload is no child of the server's process,
            # and may live less than one look.
            recycled = log_path.read_text(errors="replace").count("kind=recycle ")
        return Run(result.requests, result.rps, result.errors, recycled, result.seconds)


async def _rounds(kinds: list[str], rounds: int, quick: bool) -> dict[str, list[Run]]:
    results: dict[str, list[Run]] = {kind: [] for kind in kinds}
    load = LOAD / 2 if quick else LOAD
    with tempfile.TemporaryDirectory(prefix="fz-bench-recycling-") as workdir:
        for index in range(rounds):
            order = kinds if index % 2 == 0 else kinds[::-1]
            for kind in order:
                print(f"  round {index + 1}/{rounds}: {kind}", file=sys.stderr, flush=True)
                seconds = GRANIAN_LOAD if kind == "granian" else load
                results[kind].append(await _run(kind, Path(workdir), seconds))
    return results


def _rows(kind: str, runs: list[Run], base: list[Run] | None) -> list[dict[str, Any]]:
    name = f"recycling.{_LABELS[kind]}"
    ours = kind == TARGETED
    sent = sum(run.sent for run in runs)
    note = (
        f"{len(runs)} runs of {runs[0].seconds:.0f} s, {sent:,} requests on {CLIENTS} "
        f"keep-alive connections to one port ({loader_name()}); workers recycled per run: "
        f"{', '.join(str(run.recycled) for run in runs)}"
    )
    rates = [run.per_second for run in runs]
    ratios = None if base is None else paired(rates, [run.per_second for run in base])
    ratio = statistics.median(ratios) if ratios else None
    out = [
        row(
            name,
            f"requests/s (vs {_BASELINE_LABELS[_BASELINES.get(kind, 'serve-none')]}, side by side)",
            "req/s",
            rates,
            baseline=None if base is None else statistics.median(r.per_second for r in base),
            ratio=ratio,
            target="ratio ≥ 0.9" if ours else "(comparison)",
            command=COMMAND,
            ok=all(r >= 0.9 for r in ratios or [0.0]) if ours else None,
            note=note,
        ),
        row(
            name,
            "failed requests per run (no answer, or not 2xx)",
            "requests",
            [float(run.failed) for run in runs],
            baseline=None,
            ratio=None,
            target="0 every run" if kind.startswith("serve") else "(comparison)",
            command=COMMAND,
            ok=all(run.failed == 0 for run in runs) if kind.startswith("serve") else None,
        ),
    ]
    return out


def run(quick: bool = False) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    kinds: list[str] = []
    for kind, server in SERVERS.items():
        reason = None if server == "serve" else _missing(server)
        if reason is None:
            kinds.append(kind)
        else:
            rows.append(not_run(f"recycling.{_LABELS[kind]}", reason, COMMAND))
    results = asyncio.run(_rounds(kinds, 1 if quick else 2, quick))
    for kind in kinds:
        base = None if kind.endswith("-none") else results[_BASELINES.get(kind, "serve-none")]
        rows += _rows(kind, results[kind], base)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one round, shorter runs")
    print_table(run(parser.parse_args().quick))


if __name__ == "__main__":
    main()
