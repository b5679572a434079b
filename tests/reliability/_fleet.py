"""Generations of the reliability app as real uvicorn processes, and the orchestrator's moves.

Processes are started with the real-server helpers of ``tests/real_servers`` (bounded waits, output to a
log file) on a worker thread, so the load keeps running meanwhile. The fleet ends every process it
started, by PID, and nothing else. Orchestration speaks the wire protocol directly (paths, JSON
bodies, bearer tokens), as any orchestrator would.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio
import httpx

from forgezero_lifecycle.core._httpx import tls_context
from tests.real_servers._control import AUTH, CONTROL_TOKEN, WireControl, drain_request, new_nonce
from tests.real_servers._servers import RunningServer, start_server, stop_server
from tests.real_servers.conftest import _KNOWN_QUIRKS, _LOG_ALARMS

from ._constants import HANDOFF_TOKEN, STATE_PROTOCOL
from ._records import ServerRecords

__all__ = ["Fleet", "Generation", "revision_of"]

STATE_BEGIN: Final = "/.forgezero/runtime/state/v1/begin"
STATE_STATUS: Final = "/.forgezero/runtime/state/v1/status"
EXPORT: Final = "/.forgezero/runtime/state/v1/export"
#: uvicorn's HTTP implementations, alternated from one generation to the next.
KINDS: Final = ("uvicorn-httptools", "uvicorn-h11")


def revision_of(label: str) -> str:
    return hashlib.sha1(f"reliability generation {label}".encode()).hexdigest()


@dataclass(eq=False)
class Generation:
    """One running generation: its process, its records and a control client."""

    label: str
    revision: str
    server: RunningServer
    records_path: Path
    http: httpx.AsyncClient
    control: WireControl

    @property
    def url(self) -> str:
        return self.server.url

    def records(self) -> ServerRecords:
        return ServerRecords.read(self.records_path)

    def log_problems(self) -> list[str]:
        """Error lines in the server's own output (tracebacks, ASGI errors)."""
        text = self.server.log()
        for quirk in _KNOWN_QUIRKS:
            text = text.replace(quirk, "")
        return [line for line in text.splitlines() if any(a in line for a in _LOG_ALARMS)]

    async def stats(self) -> dict[str, Any]:
        response = await self.http.get("/_rel/stats")
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    async def begin_drain(self, target: Generation | None = None, timeout_ms: int = 10_000) -> str:
        """Begin a drain of this generation towards ``target``; returns the nonce."""
        nonce = new_nonce()
        body = {
            **drain_request(nonce, timeout_ms),
            "sourceRevision": self.revision,
            "targetRevision": (target or self).revision,
        }
        response = await self.http.post(
            "/.forgezero/runtime/drain/v1/begin", json=body, headers=AUTH
        )
        assert response.status_code == 202, response.text
        self.control.nonces.append(nonce)
        return nonce

    async def begin_handoff(
        self, source_url: str, source_revision: str, *, timeout_ms: int = 5000
    ) -> tuple[str, httpx.Response]:
        """Ask this (new) generation to fetch state from ``source_url``; returns (nonce, reply)."""
        nonce = new_nonce()
        body = {
            "protocol": STATE_PROTOCOL,
            "nonce": nonce,
            "schemaVersion": 1,
            "sourceRevision": source_revision,
            "targetRevision": self.revision,
            "source": {"url": source_url, "authorization": f"Bearer {HANDOFF_TOKEN}"},
            "timeoutMs": timeout_ms,
        }
        return nonce, await self.http.post(STATE_BEGIN, json=body, headers=AUTH)

    async def take_over_state(self, source: Generation, *, timeout_ms: int = 5000) -> str:
        """Begin the handoff from ``source``'s export; returns the nonce."""
        query = f"?sourceRevision={source.revision}&targetRevision={self.revision}"
        nonce, response = await self.begin_handoff(
            source.url + EXPORT + query, source.revision, timeout_ms=timeout_ms
        )
        assert response.status_code == 202, response.text
        return nonce

    async def handoff_status(self, nonce: str) -> dict[str, Any]:
        response = await self.http.get(STATE_STATUS, params={"nonce": nonce}, headers=AUTH)
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    async def wait_handoff(self, nonce: str, seconds: float = 15.0) -> dict[str, Any]:
        """Poll until the handoff settles (acknowledged or failed), bounded."""
        with anyio.fail_after(seconds):
            while True:
                status = await self.handoff_status(nonce)
                if status["status"] != "pending":
                    return status
                await anyio.sleep(0.02)


class Fleet:
    """Starts generations; stops (SIGTERM) or kills (SIGKILL) them by PID; cleans up all."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.generations: list[Generation] = []
        self._started = 0

    async def start(self, label: str, *, kind: str | None = None, **env: str) -> Generation:
        """Start generation ``label`` (extra ``FZREL_*`` settings in ``env``) and wait for it."""
        kind = kind or KINDS[self._started % len(KINDS)]
        self._started += 1
        records = self.directory / f"{label}.records"
        revision = revision_of(label)
        environment = {
            "FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN,
            "FORGEZERO_HANDOFF_TOKEN": HANDOFF_TOKEN,
            "FORGEZERO_REVISION": revision,
            "FZREL_GENERATION": label,
            "FZREL_RECORDS": str(records),
            **env,
        }
        log_path = self.directory / f"{label}.log"
        server = await anyio.to_thread.run_sync(
            lambda: start_server(
                kind, "tests.reliability.app:app", log_path=log_path, environment=environment
            )
        )
        http = httpx.AsyncClient(
            base_url=server.url, timeout=10.0, trust_env=False, verify=tls_context()
        )
        generation = Generation(label, revision, server, records, http, WireControl(http))
        self.generations.append(generation)
        return generation

    async def stop(self, generation: Generation) -> tuple[int, float]:
        """SIGTERM by PID and wait; returns (exit code, monotonic time the process was gone)."""
        await anyio.to_thread.run_sync(stop_server, generation.server)
        gone = time.monotonic()
        await generation.http.aclose()
        code = generation.server.process.returncode
        assert code is not None
        return code, gone

    async def kill(self, generation: Generation) -> None:
        """SIGKILL by PID and reap."""
        process = generation.server.process
        if process.poll() is None:
            process.kill()
        await anyio.to_thread.run_sync(lambda: process.wait(10))

    async def aclose(self) -> None:
        for generation in self.generations:
            await anyio.to_thread.run_sync(stop_server, generation.server)
            await generation.http.aclose()
