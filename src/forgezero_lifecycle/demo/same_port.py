"""The demo's second act: one host, one port, no router. ``serve --workers 2`` hands over on SIGHUP.

::

    1. a supervisor holds the port for generation 1 (two worker processes)
    2. HTTP clients keep sending to that one port
    3. SIGHUP: generation 2 starts on the same socket and proves it is ready; only then does
       generation 1 stop accepting, drain and exit
    4. SIGTERM: the last generation drains, the socket refuses new handshakes, the queue is
       answered, the supervisor exits 0

The clients have nowhere else to go, so a lost request is one that got no answer and a refused
one is a 503 they had to retry: the act passes when both are 0 before the SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .load import HttpTally, one_port_clients
from .processes import free_port, revision_of

__all__ = ["SamePortResult", "same_port_handover"]

APP: Final = "forgezero_lifecycle.demo.app:app"
BOUND: Final = 30.0
#: The supervisor's log lines that name a generation's workers once they are all ready.
_PIDS: Final = re.compile(
    r"supervisor\.(?:serving|new_generation_ready) generation=(\d+) pids=\[([\d, ]+)\]"
)


@dataclass
class SamePortResult:
    """What the clients of the one port saw across the handover."""

    tally: HttpTally
    generations: dict[int, list[int]]
    handover_seconds: float
    exit_code: int | None

    @property
    def refused(self) -> int:
        return self.tally.refused_then_completed

    @property
    def problems(self) -> list[str]:
        found = list(self.tally.problems)
        if self.refused:
            found.append(f"{self.refused} requests refused during the same-port handover")
        pids = [pid for workers in self.generations.values() for pid in workers]
        if len(self.generations) != 2 or len(set(pids)) != len(pids):
            found.append(f"expected two generations of distinct workers, saw {self.generations}")
        if self.exit_code != 0:
            found.append(f"the supervisor exited with {self.exit_code}")
        return found

    def render(self) -> list[str]:
        completed = sum(self.tally.completed.values())
        first, second = (self.generations.get(n, []) for n in (1, 2))
        return [
            "Same port, no router: `serve --workers 2` and a SIGHUP handover",
            f"  HTTP requests                {self.tally.sent:6d}   (one port, clients never moved)",
            f"  completed                    {completed:6d}",
            f"  refused                      {self.refused:6d}   (the new generation was ready first)",
            f"  lost                         {self.tally.lost:6d}",
            f"  workers  generation 1 {first}  ->  generation 2 {second}",
            f"  handover                     {self.handover_seconds:6.1f} s   "
            f"(SIGHUP to generation 1 gone); exit code {self.exit_code}",
        ]


async def same_port_handover(
    env: dict[str, str], log_dir: Path, *, clients: int, seconds: float
) -> SamePortResult:
    """Run the act; the supervisor is stopped (and, if it must be, killed) before this returns."""
    port = free_port()
    revision_file = log_dir / "revision"
    revision_file.write_text(revision_of("C1") + "\n")
    log_path = log_dir / "same-port.log"
    command = [
        sys.executable, "-m", "forgezero_lifecycle", "serve", APP, "--workers", "2",
        "--host", "127.0.0.1", "--port", str(port), "--revision-file", str(revision_file),
        "--drain-timeout", "5s", "--log-level", "info", "--no-access-log",
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *command,
            env={**os.environ, **env, "FORGEZERO_DEMO_GENERATION": "C"},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
    try:
        return await _act(process, port, log_path, revision_file, clients, seconds)
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), BOUND)


async def _act(
    process: asyncio.subprocess.Process,
    port: int,
    log_path: Path,
    revision_file: Path,
    clients: int,
    seconds: float,
) -> SamePortResult:
    url = f"http://127.0.0.1:{port}"
    await _wait_log(process, log_path, "supervisor.serving generation=1")
    async with one_port_clients(url, clients, seed=500) as tally:
        await asyncio.sleep(seconds)
        await asyncio.to_thread(revision_file.write_text, revision_of("C2") + "\n")
        sighup_at = time.monotonic()
        process.send_signal(signal.SIGHUP)
        await _wait_log(process, log_path, "supervisor.handover_done from=1 to=2")
        handover = time.monotonic() - sighup_at
        await asyncio.sleep(seconds)
    process.send_signal(signal.SIGTERM)
    exit_code = await asyncio.wait_for(process.wait(), BOUND)
    generations = {
        int(number): [int(pid) for pid in pids.split(",")]
        for number, pids in _PIDS.findall(await _read(log_path))
    }
    return SamePortResult(tally, generations, handover, exit_code)


async def _wait_log(process: asyncio.subprocess.Process, log_path: Path, text: str) -> None:
    deadline = time.monotonic() + BOUND
    while text not in (log := await _read(log_path)):
        if process.returncode is not None or time.monotonic() > deadline:
            tail = "\n".join(log.splitlines()[-15:])
            raise RuntimeError(f"the supervisor never logged {text!r}:\n{tail}")
        await asyncio.sleep(0.05)


async def _read(path: Path) -> str:
    return await asyncio.to_thread(path.read_text, errors="replace")
