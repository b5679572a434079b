"""One worker process as the supervisor sees it: its process, its channel, its last report.

The worker's side is :mod:`.worker`; what a report means for the generation is
:mod:`.generation`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, final

from .channel import Channel, ChannelClosedError

if TYPE_CHECKING:
    from .generation import Generation

__all__ = ["COUNTER_KINDS", "StartFailedError", "WorkerProcess", "exit_reason"]

logger = logging.getLogger("forgezero_lifecycle.serve.supervisor")

COUNTER_KINDS: Final = ("http", "websocket", "jobs", "schedules")
#: How long a worker may take to answer one command on its channel.
COMMAND_TIMEOUT: Final = 10.0


class StartFailedError(Exception):
    """A generation could not start: one of its workers died or was not ready in time."""


def exit_reason(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@final
class WorkerProcess:
    """One worker as the supervisor sees it: its process, its channel, its last report."""

    def __init__(self, generation: Generation, index: int) -> None:
        self.generation = generation
        self.index = index
        self.process: asyncio.subprocess.Process | None = None
        self.channel: Channel | None = None
        self.state = "starting"
        self.in_flight: dict[str, int] = dict.fromkeys(COUNTER_KINDS, 0)
        self.failure: str | None = None
        self.detail: str | None = None
        self.stopping = False
        self.ready = asyncio.Event()
        self.exited = asyncio.Event()
        self.exit_reason: str | None = None
        self.revision: str | None = None
        self.state_kind: dict[str, Any] | None = None
        self.private_port = 0
        self._waiter: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def name(self) -> str:
        return f"worker {self.index} (pid {self.pid}) of generation {self.generation.number}"

    async def spawn(self, listeners: Sequence[socket.socket], config: dict[str, Any]) -> None:
        ours, theirs = socket.socketpair()
        fds = [sock.fileno() for sock in listeners]
        command = [
            sys.executable, "-m", "forgezero_lifecycle.serve.worker",
            "--channel-fd", str(theirs.fileno()), "--supervisor-pid", str(os.getpid()),
            *(f"--listen-fd={fd}" for fd in fds),
        ]  # fmt: skip
        try:
            self.process = await asyncio.create_subprocess_exec(
                *command, pass_fds=(theirs.fileno(), *fds), stdin=asyncio.subprocess.DEVNULL
            )
        finally:
            theirs.close()
        self.channel = await Channel.open(ours, self._handle)
        self.channel.notify(config)
        self._waiter = asyncio.create_task(self._wait())
        logger.info("supervisor.worker_started %s", self.name)

    async def _wait(self) -> None:
        assert self.process is not None
        assert self.channel is not None
        code = await self.process.wait()
        self.exit_reason = exit_reason(code)
        self.exited.set()
        await self.channel.aclose()
        self.generation.worker_exited(self)

    async def _handle(self, message: dict[str, Any]) -> dict[str, Any] | None:
        if message.get("event") == "state":
            self._report(message)
            return None
        if message.get("op") == "control":
            return await self.generation.forwarded.answer(message["request"])
        return {"error": "RUNTIME_NOT_FOUND"}

    def _report(self, message: dict[str, Any]) -> None:
        nonce = message.get("nonce")
        request = self.generation.request
        if nonce is not None and (request is None or nonce != request.nonce):
            return  # the end of an earlier drain, reported late
        self.state = message["state"]
        if isinstance(message.get("inFlight"), dict):
            self.in_flight = message["inFlight"]
        self.failure = message.get("failure")
        if message.get("detail"):
            self.detail = message["detail"]
        if self.state == "ready":
            self.state_kind = message.get("stateKind")
            self.revision = message.get("revision")
            self.private_port = int(message.get("privatePort", 0))
            self.ready.set()
        self.generation.changed()

    async def command(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send ``op``; an unreachable worker answers ``RUNTIME_WORKER_GONE``."""
        if self.channel is None or self.exited.is_set():
            return {"error": "RUNTIME_WORKER_GONE"}
        try:
            answer = await self.channel.request(op, timeout=COMMAND_TIMEOUT, **fields)
        except (ChannelClosedError, TimeoutError):
            return {"error": "RUNTIME_WORKER_GONE"}
        if isinstance(answer.get("inFlight"), dict):
            self.in_flight = answer["inFlight"]
        return answer

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)

    def summary(self) -> dict[str, Any]:
        found: dict[str, Any] = {"worker": self.index, "pid": self.pid, "status": self.state}
        if self.exited.is_set():
            found["exited"] = self.exit_reason
        found["inFlight"] = dict(self.in_flight)
        if self.failure:
            found["failure"] = self.failure
        return found
