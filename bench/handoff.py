"""State handoff end to end between two real generations, for 1 KiB, 64 KiB and 1 MiB states.

For each size, one old generation and several new ones run ``bench/apps/state.py`` under uvicorn
(separate processes on 127.0.0.1). The old one is drained first (export needs closed intake).
Each sample then asks a fresh new generation (a controller hands over once per process) to
``begin`` the handoff with the public client, and waits on the app's ``/bench/handoff-wait``
route, which returns the moment the status is ``acknowledged``: the figure is ``begin`` sent →
acknowledged, so it covers the export on the old server (dump, canonical JSON, digest), the
loopback transfer, and the fetch, checks and import on the new one. Before each sample the old
generation's state moves on (``POST /bench/next-state``: ``generation`` one higher), so every
timed export serves a value JSON exported for the first time, as a rollout's single export does.
The export URL says ``importCheck=importer``, as the URLs ``forgezero-lifecycle handoff`` and
``serve``'s supervisor build do: the new generation's strict validation is the value's one
check, and the old generation does not make it a second time (without the parameter the export
checks first that the value imports as its model, which the 1 MiB state pays in about 50 ms).

Baseline: what a plain typed transfer of the same value costs without the runtime: an ``httpx``
GET of the value's JSON bytes from the old server (the client built beforehand, the bytes
prepared at startup), ``orjson.loads`` and ``ShopState.model_validate`` of the result, one per
sample, the order alternating. The ratio is what the handoff adds on top: the export's dump,
canonical JSON and digest, the envelope, and on the new side the canonical JSON, strict
validation and digest check. Target: p50 ≤ 100 ms for 1 MiB. The note
also gives the CPU time each sample took (both generations' processes for a handoff, the old
server and the benchmark's process for the baseline), which other load on the machine disturbs
less than the wall time.

Each size runs with the runtime's default, the process's collector left alone; 1 MiB runs a
second time right after with ``Runtime(handoff_pauses_collector=True)`` on both generations
(the collector paused while a state is sealed or opened), the two rows side by side.

Run ``python -m bench.handoff [--quick] [--only "1 MiB"]``.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import httpx
import orjson

from bench._report import paired, print_table, row
from bench.apps.shop import ShopState
from bench.server import Server, cpu_ns, start_servers, stop_servers
from forgezero_lifecycle.client import ControlClient, drain_request, handoff_request
from forgezero_lifecycle.wire.paths import (
    IMPORT_CHECK_QUERY,
    IMPORTER_CHECKS,
    RUNTIME_STATE_EXPORT_PATH,
)

__all__ = ["run"]

SIZES: Final = {"1 KiB": 1024, "64 KiB": 64 * 1024, "1 MiB": 1024 * 1024}
TARGET_MS: Final = {"1 MiB": 100.0}
#: The sizes also run with the collector paused (``Runtime(handoff_pauses_collector=True)``).
PAUSED_TOO: Final = frozenset({"1 MiB"})
APP: Final = "bench.apps.state:app"
PROTOCOL: Final = "bench.shop"


class _Generations:
    """Tokens and revisions shared by the old generation and its successors."""

    def __init__(self) -> None:
        self.control = secrets.token_urlsafe(24)
        self.handoff = secrets.token_urlsafe(32)
        self.old_revision = secrets.token_hex(20)
        self.new_revision = secrets.token_hex(20)

    def environment(self, revision: str, state_bytes: int, *, paused: bool) -> dict[str, str]:
        return {
            "FORGEZERO_CONTROL_TOKEN": self.control,
            "FORGEZERO_HANDOFF_TOKEN": self.handoff,
            "FORGEZERO_REVISION": revision,
            "FZ_BENCH_STATE_BYTES": str(state_bytes),
            "FZ_BENCH_PAUSE_COLLECTOR": "1" if paused else "0",
        }


async def _blob_ms(client: httpx.AsyncClient, old: Server) -> tuple[float, int]:
    """The baseline: a plain GET of the value's bytes, parsed and validated as its model."""
    started = time.perf_counter()
    response = await client.get(old.url + "/bench/blob")
    ShopState.model_validate(orjson.loads(response.content))
    elapsed = (time.perf_counter() - started) * 1000
    response.raise_for_status()
    return elapsed, len(response.content)


async def _handoff_ms(new: Server, gens: _Generations, source_url: str) -> float:
    """``begin`` on ``new`` → acknowledged, with both connections opened beforehand."""
    request = handoff_request(
        protocol=PROTOCOL,
        schema_version=1,
        source_revision=gens.old_revision,
        target_revision=gens.new_revision,
        source_url=source_url,
        handoff_token=gens.handoff,
    )
    async with (
        ControlClient(new.url, token=gens.control) as control,
        httpx.AsyncClient(base_url=new.url, timeout=30, trust_env=False) as waiter,
    ):
        await control.live()
        (await waiter.get("/.forgezero/runtime/live")).raise_for_status()
        started = time.perf_counter()
        await control.begin_handoff(request, timeout_ms=30_000)
        response = await waiter.get("/bench/handoff-wait", params={"nonce": request.nonce})
        elapsed = (time.perf_counter() - started) * 1000
        status = response.json()
        if status.get("status") != "acknowledged":
            raise RuntimeError(f"handoff ended {status}")
        confirmed = await control.handoff_status(request.nonce)
        if confirmed.status != "acknowledged":
            raise RuntimeError(f"status endpoint says {confirmed.status}")
    return elapsed


class _Cpu:
    """CPU ms per sample: both generations' processes for a handoff; the old server's and this
    process's for the baseline. Less disturbed by other load on the machine than the wall time."""

    def __init__(self) -> None:
        self.handoff: list[float] = []
        self.baseline: list[float] = []

    @staticmethod
    def now(*pids: int) -> float:
        return sum(cpu_ns(pid) for pid in pids) / 1e6

    def note(self) -> str:
        if not self.handoff:
            return ""
        handoff, baseline = statistics.median(self.handoff), statistics.median(self.baseline)
        return f"; CPU per sample (median): handoff {handoff:.1f} ms, baseline {baseline:.1f} ms"


async def _timed_blob(client: httpx.AsyncClient, old: Server, cpu: _Cpu) -> float:
    before, own = cpu.now(old.pid), time.process_time()
    elapsed, _ = await _blob_ms(client, old)
    cpu.baseline.append(cpu.now(old.pid) - before + (time.process_time() - own) * 1000)
    return elapsed


async def _timed_handoff(
    new: Server, old: Server, gens: _Generations, url: str, cpu: _Cpu
) -> float:
    async with httpx.AsyncClient(base_url=old.url, trust_env=False) as client:
        (await client.post("/bench/next-state")).raise_for_status()
    before = cpu.now(old.pid, new.pid)
    elapsed = await _handoff_ms(new, gens, url)
    cpu.handoff.append(cpu.now(old.pid, new.pid) - before)
    return elapsed


async def _measure_size(
    old: Server, news: list[Server], gens: _Generations, cpu: _Cpu
) -> tuple[list[float], list[float], int]:
    async with ControlClient(old.url, token=gens.control, handoff_token=gens.handoff) as control:
        drain = drain_request(
            source_revision=gens.old_revision,
            target_revision=gens.new_revision,
            timeout_ms=600_000,
        )
        await control.begin_drain(drain)
        await asyncio.wait_for(control.wait_drained(drain.nonce, poll_interval=0.02), 30)
        await control.export_state(gens.old_revision, gens.new_revision)  # warm the export path
    source_url = (
        f"{old.url}{RUNTIME_STATE_EXPORT_PATH}"
        f"?sourceRevision={gens.old_revision}&targetRevision={gens.new_revision}"
        f"&{IMPORT_CHECK_QUERY}={IMPORTER_CHECKS}"
    )
    handoffs: list[float] = []
    blobs: list[float] = []
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        _, size = await _blob_ms(client, old)  # warm the baseline path
        for index, new in enumerate(news):
            if index % 2:
                handoffs.append(await _timed_handoff(new, old, gens, source_url, cpu))
                blobs.append(await _timed_blob(client, old, cpu))
            else:
                blobs.append(await _timed_blob(client, old, cpu))
                handoffs.append(await _timed_handoff(new, old, gens, source_url, cpu))
    return handoffs, blobs, size


def run(quick: bool, only: str | None = None) -> list[dict[str, Any]]:
    """One row per state size (two for 1 MiB: collector left alone, then paused): begin →
    acknowledged, beside a GET, parse and validate of the value. ``only``: that size's rows."""
    samples = 3 if quick else 7
    command = ".venv/bin/python -m bench.handoff" + (" --quick" if quick else "")
    runs = [
        (label, size, paused)
        for label, size in SIZES.items()
        if only is None or label == only
        for paused in ((False, True) if label in PAUSED_TOO else (False,))
    ]
    rows = []
    with tempfile.TemporaryDirectory(prefix="fz-bench-handoff-") as tmp:
        for label, size, paused in runs:
            rows.append(_size_row(label, size, paused, samples, command, Path(tmp)))
    return rows


def _size_row(
    label: str, size: int, paused: bool, samples: int, command: str, tmp: Path
) -> dict[str, Any]:
    gens = _Generations()
    environment = [gens.environment(gens.old_revision, size, paused=paused)]
    environment += [gens.environment(gens.new_revision, 0, paused=paused)] * samples
    servers = start_servers([APP] * (samples + 1), tmp, environment)
    cpu = _Cpu()
    try:
        handoffs, blobs, value_bytes = asyncio.run(
            _measure_size(servers[0], servers[1:], gens, cpu)
        )
    finally:
        stop_servers(servers)
    target = TARGET_MS.get(label)
    collector = ", collector paused" if paused else ""
    return row(
        f"handoff {label} state ({value_bytes:,} B value JSON){collector}",
        "begin → acknowledged, vs httpx GET + orjson.loads + model_validate",
        "ms",
        handoffs,
        baseline=statistics.median(blobs),
        ratio=round(statistics.median(paired(handoffs, blobs)), 2),
        target=f"p50 ≤ {target:g} ms" if target else "(comparison)",
        command=command,
        ok=statistics.median(handoffs) <= target if target else None,
        note=(
            f"{samples} handoffs, each to a fresh new-generation uvicorn process, "
            "from one drained old generation whose state moves on before each "
            "(every timed export is its state's first); "
            + (
                "both generations with Runtime(handoff_pauses_collector=True); "
                if paused
                else "the collector left alone (the default); "
            )
            + "baseline: httpx GET of the same value "
            "bytes from the old server (client built beforehand) + orjson.loads + "
            "ShopState.model_validate, alternating order" + cpu.note()
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="3 handoffs per size instead of 7")
    parser.add_argument("--only", choices=list(SIZES), help="only this size's rows")
    args = parser.parse_args(argv)
    print_table(run(args.quick, args.only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
