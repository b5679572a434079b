"""Generations as subprocesses: ``forgezero-lifecycle serve`` of the demo app on loopback.

Output goes to a log file (a pipe nobody reads could fill up and stall the server); every wait
is bounded; every process is stopped by its own PID, killed if it does not stop in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

import httpx

from ..wire import paths

__all__ = ["Generation", "free_port", "revision_of", "start_generation"]

APP: Final = "forgezero_lifecycle.demo.app:app"
START_BOUND: Final = 20.0
STOP_BOUND: Final = 15.0


def revision_of(label: str) -> str:
    """A stable 40-hex revision for a demo generation label."""
    return hashlib.sha1(f"forgezero demo generation {label}".encode()).hexdigest()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@final
@dataclass
class Generation:
    """One running generation of the demo app."""

    label: str
    revision: str
    port: int
    process: asyncio.subprocess.Process
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    async def stop(self) -> int | None:
        """SIGTERM (the server drains itself, or follows a drain already done) and wait."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.process.wait(), STOP_BOUND)
        except TimeoutError:
            await self.kill()
            return None

    async def kill(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.process.wait(), STOP_BOUND)


async def start_generation(
    label: str, env: dict[str, str], log_dir: Path, *, drain_timeout: float
) -> Generation:
    """Start the demo app as generation ``label``; return once its probes say ready."""
    port = free_port()
    revision = revision_of(label)
    log_path = log_dir / f"generation-{label}.log"
    command = [
        sys.executable,
        "-m",
        "forgezero_lifecycle",
        "serve",
        APP,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--revision",
        revision,
        "--drain-timeout",
        f"{drain_timeout}s",
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *command,
            env={**os.environ, **env, "FORGEZERO_DEMO_GENERATION": label},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
    generation = Generation(label, revision, port, process, log_path)
    try:
        await _wait_ready(generation)
    except BaseException:
        await generation.kill()
        raise
    return generation


async def _wait_ready(generation: Generation) -> None:
    deadline = time.monotonic() + START_BOUND
    async with httpx.AsyncClient(base_url=generation.url, timeout=1.0, trust_env=False) as http:
        while True:
            if generation.process.returncode is not None:
                raise RuntimeError(
                    f"generation {generation.label} exited with "
                    f"{generation.process.returncode}:\n{generation.log_tail()}"
                )
            with contextlib.suppress(httpx.TransportError):
                if (await http.get(paths.RUNTIME_READY_PATH)).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"generation {generation.label} was not ready within {START_BOUND:g} s:\n"
                    f"{generation.log_tail()}"
                )
            await asyncio.sleep(0.05)
