"""The supervisor's handle on one worker process: its process, its channel, its last report.

The worker process itself is :mod:`.worker`. A handle knows nothing of its generation: what
happens to the process (ready, a report, its exit) goes to the callbacks it was given, and the
control requests its worker forwards go to ``answer``.

:meth:`WorkerHandle.probe` asks the worker's HTTP server itself (``GET`` of the live path on
the worker's private loopback listener, which the same server and event loop answer as the
shared listeners): a handover's proof that its new workers serve (:mod:`.supervisor`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Literal, final, get_args

from ..wire import paths
from .channel import (
    COMMANDS,
    COUNTER_KINDS,
    Channel,
    ChannelClosedError,
    ControlCall,
    LimitReport,
    MessageTooLargeError,
    StateReport,
    decode_worker_message,
)

__all__ = ["COMMAND_TIMEOUT", "WorkerHandle", "exit_reason"]

logger = logging.getLogger("forgezero_lifecycle.serve.supervisor")

#: How long a worker may take to answer one command on its channel, after the deadline the
#: command carries, if any (:func:`answer_bound`).
COMMAND_TIMEOUT: Final = 10.0

#: Answers a forwarded control call: ``answer(call, args)`` → ``{"status", "headers", "body"}``.
Answer = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
#: Told when the supervisor's handler of a message from this worker raised:
#: ``on_failure(worker, message, error)``.
HandlerFailed = Callable[["WorkerHandle", dict[str, Any], Exception], None]
#: The request of :meth:`WorkerHandle.probe` (any HTTP answer to it counts).
_PROBE: Final = (
    f"GET {paths.RUNTIME_LIVE_PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
).encode()
#: What the drain report of the worker says (``booting`` until its first report).
DrainReport = Literal["booting", "ready", "draining", "drained", "failed", "rolled-back"]
_REPORTS: Final[dict[str, DrainReport]] = {name: name for name in get_args(DrainReport)}


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
class WorkerHandle:
    """One worker as the supervisor sees it (see the module docstring)."""

    def __init__(
        self,
        index: int,
        generation: int,
        *,
        answer: Answer,
        on_ready: Callable[[WorkerHandle], None],
        on_report: Callable[[WorkerHandle], None],
        on_exit: Callable[[WorkerHandle], None],
        on_failure: HandlerFailed,
        on_limit: Callable[[WorkerHandle, str], None] | None = None,
    ) -> None:
        self.index = index
        self.generation = generation
        self._answer = answer
        self._on_ready = on_ready
        self._on_report = on_report
        self._on_exit = on_exit
        self._on_failure = on_failure
        self._on_limit = on_limit
        #: It leaves its generation alone (recycled, scaled down): it drains on its own bound,
        #: apart from the generation's drain.
        self.retiring = False
        self.process: asyncio.subprocess.Process | None = None
        self.channel: Channel | None = None
        self._report: DrainReport = "booting"
        self.in_flight: dict[str, int] = dict.fromkeys(COUNTER_KINDS, 0)
        #: The oldest requests running in the worker at its last ``status`` answer (what a
        #: drain's status names in ``detail.oldestInFlight``).
        self.oldest_in_flight: list[dict[str, Any]] = []
        self.failure: str | None = None
        self.detail: str | None = None
        self.ready = asyncio.Event()
        self.exited = asyncio.Event()
        self.exit_reason: str | None = None
        #: The process's exit status once it exited (negative: the signal that killed it).
        self.exit_code: int | None = None
        self.revision: str | None = None
        self.state_kind: dict[str, Any] | None = None
        self.private_port = 0
        #: The nonce of the generation's drain this worker's reports must name (None: any).
        self.drain_nonce: str | None = None
        #: It answered the supervisor's ``accept``: it accepts on the shared listeners.
        self.accepting = False

    def release(self) -> None:
        """Its generation is forgotten (its process is gone): drop what points back at the
        supervisor and the generation, so that neither waits for the cyclic collector."""
        self._answer = _answer_nothing
        self._on_ready = self._on_report = self._on_exit = _nothing
        self._on_failure = _nothing
        self._on_limit = None

    @property
    def report(self) -> DrainReport:
        return self._report

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def name(self) -> str:
        return f"worker {self.index} (pid {self.pid}) of generation {self.generation}"

    # The drain report, changed only here.

    def drain_begun(self, nonce: str) -> None:
        self.drain_nonce = nonce
        if not self.exited.is_set():
            self._report = "draining"

    def drain_refused(self, code: str) -> None:
        """The worker refused the generation's begin: it will not drain."""
        if self._report == "draining":
            self._report, self.failure = "failed", code

    def rolled_back(self) -> None:
        if not self.exited.is_set():
            self._report = "ready"

    def _take(self, report: StateReport) -> None:
        if report.nonce is not None and report.nonce != self.drain_nonce:
            return  # the end of an earlier drain, reported late
        state = _REPORTS.get(report.state)
        if state is None:
            logger.warning("supervisor.unknown_report %s state=%r", self.name, report.state)
            return
        self._report = state
        if report.in_flight is not None:
            self.in_flight = dict(report.in_flight)
        self.failure = report.failure
        if report.detail:
            self.detail = report.detail
        if report.state == "ready" and not self.ready.is_set():
            self.state_kind = report.state_kind
            self.revision = report.revision
            self.private_port = report.private_port
            self.ready.set()
            self._on_ready(self)
        self._on_report(self)

    # The process.

    async def spawn(
        self, listeners: Sequence[socket.socket], config: dict[str, Any], tally: int
    ) -> None:
        """Start the process; ``tally`` is the descriptor of its generation's tally."""
        ours, theirs = socket.socketpair()
        fds = [sock.fileno() for sock in listeners]
        command = [
            sys.executable, "-m", "forgezero_lifecycle.serve.worker",
            "--channel-fd", str(theirs.fileno()), "--supervisor-pid", str(os.getpid()),
            *(f"--listen-fd={fd}" for fd in fds), "--tally-fd", str(tally),
        ]  # fmt: skip
        try:
            self.process = await asyncio.create_subprocess_exec(
                *command, pass_fds=(theirs.fileno(), *fds, tally), stdin=asyncio.subprocess.DEVNULL
            )
        finally:
            theirs.close()
        self.channel = await Channel.open(ours, self._handle, self._handler_failed)
        self.channel.notify(config)
        logger.info("supervisor.worker_started %s", self.name)

    def never_started(self) -> None:
        """The process was never spawned (its generation could not start): it counts as exited."""
        if not self.exited.is_set():
            self.exit_reason = "never started"
            self.exited.set()
            self._on_exit(self)

    async def watch(self) -> None:
        """Wait for the spawned process to exit, then report it (the supervisor runs this in its
        task group, once :meth:`spawn` has returned)."""
        assert self.process is not None
        assert self.channel is not None
        code = await self.process.wait()
        self.exit_code = code
        self.exit_reason = exit_reason(code)
        self.exited.set()
        await self.channel.aclose()
        self._on_exit(self)

    def _handler_failed(self, message: dict[str, Any], error: Exception) -> None:
        self._on_failure(self, message, error)

    async def _handle(self, message: dict[str, Any]) -> dict[str, Any] | None:
        decoded = decode_worker_message(message)
        match decoded:
            case StateReport():
                self._take(decoded)
                return None
            case ControlCall(call=call, args=args):
                return await self._answer(call, args)
            case LimitReport(why=why):
                if self._on_limit is not None:
                    self._on_limit(self, why)
                return None
            case _:
                logger.warning("supervisor.bad_message %s: %s", self.name, decoded)
                return {"error": "RUNTIME_BAD_MESSAGE", "detail": decoded}

    async def command(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send ``op`` (one of :data:`~.channel.COMMANDS`, with its fields); an unreachable
        worker answers ``RUNTIME_WORKER_GONE``."""
        expected = COMMANDS.get(op)
        if expected is None or not set(fields) <= set(expected):
            raise ValueError(f"no command {op!r} with fields {sorted(fields)}")
        if self.channel is None or self.exited.is_set():
            return {"error": "RUNTIME_WORKER_GONE"}
        try:
            answer = await self.channel.request(op, timeout=answer_bound(fields), **fields)
        except (ChannelClosedError, TimeoutError):
            return {"error": "RUNTIME_WORKER_GONE"}
        except MessageTooLargeError:
            logger.error("supervisor.command_too_large %s op=%s", self.name, op)
            return {"error": "RUNTIME_MESSAGE_TOO_LARGE"}
        if isinstance(answer.get("inFlight"), dict):
            self.in_flight = answer["inFlight"]
        if isinstance(answer.get("oldestInFlight"), list):
            self.oldest_in_flight = answer["oldestInFlight"]
        return answer

    async def ping(self, timeout: float) -> bool | None:
        """The heartbeat: True when the worker's event loop answered within ``timeout``, False
        when it did not, None when the worker is gone."""
        if self.channel is None or self.exited.is_set():
            return None
        try:
            answer = await self.channel.request("ping", timeout=timeout)
        except TimeoutError:
            return None if self.exited.is_set() else False
        except ChannelClosedError:
            return None
        if isinstance(answer.get("inFlight"), dict):
            self.in_flight = answer["inFlight"]
        return True

    async def probe(self, timeout: float) -> bool:
        """True when the worker's HTTP server answered a ``GET`` of the live path on its private
        listener within ``timeout`` (its event loop runs and its server answers; any status
        counts), False otherwise (no answer in time, refused, gone)."""
        if self.exited.is_set() or not self.private_port:
            return False
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection("127.0.0.1", self.private_port)
                writer.write(_PROBE)
                status = await reader.readline()
                await reader.read()  # to its end: the server closes the connection first
        except (OSError, TimeoutError):
            return False
        finally:
            if writer is not None:
                writer.close()
        return status.startswith(b"HTTP/")

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)

    def summary(self) -> dict[str, Any]:
        found: dict[str, Any] = {"worker": self.index, "pid": self.pid, "status": self._report}
        if self.exited.is_set():
            found["exited"] = self.exit_reason
        found["inFlight"] = dict(self.in_flight)
        if self.failure:
            found["failure"] = self.failure
        return found


def answer_bound(fields: dict[str, Any]) -> float:
    """How long the supervisor waits for the answer to a command with ``fields``: a command
    that carries its own deadline (``timeoutMs``: a state import, bounded by the drain's
    deadline) is answered once that has passed, so :data:`COMMAND_TIMEOUT` counts after it."""
    deadline = fields.get("timeoutMs")
    own = deadline / 1000 if isinstance(deadline, int) and deadline > 0 else 0.0
    return own + COMMAND_TIMEOUT


__all__ += ["Answer", "DrainReport", "HandlerFailed", "answer_bound"]


def _nothing(*_: object) -> None:
    return None


async def _answer_nothing(*_: object) -> dict[str, Any]:
    return {"error": "RUNTIME_WORKER_GONE"}
