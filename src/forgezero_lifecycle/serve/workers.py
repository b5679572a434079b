"""The supervisor's side of its workers: a handle on each worker process, and the generation of
N of them that drain as one.

:class:`WorkerHandle`: one worker process, its channel, its last report. The worker process
itself is :mod:`.worker`. A handle knows nothing of its generation: what happens to the process
(ready, a report, its exit) goes to the callbacks it was given, and the control requests its
worker forwards go to ``answer``. :meth:`WorkerHandle.probe` asks the worker's HTTP server
itself (``GET`` of the live path on the worker's private loopback listener, which the same
server and event loop answer as the shared listeners): a handover's proof that its new workers
serve (:mod:`.supervisor`).

:class:`Generation`: it owns a :class:`~forgezero_lifecycle.core.drain.DrainController` whose
dependencies fan out to the workers over their private channels: ``begin`` reaches every ready
worker's own runtime in the same instant with the same request (nonce, revisions,
``timeoutMs``), and the controller races the same deadline. A worker not ready when the drain
began (a replacement still importing) holds no admitted work: the drain neither reaches nor
waits for it; a replacement ready while the drain holds the generation joins it before it
accepts (:meth:`Generation.join_drain`). The public control plane of any worker forwards the
drain paths to the supervisor, which answers them for the generation through the ``answer``
callback it gave (:class:`~.supervisor.ForwardedControl` builds it over this generation).
Status aggregates: counters are the sums over the workers, ``drained`` only once every worker
drained, ``failed`` as soon as one failed or died (``detail.workers`` says which), and rollback
rolls back every worker.

What the generation's workers and drain do is reported to the supervisor through callbacks
(``on_ready``, ``on_exit``, ``on_drain``, and ``on_failure`` when its answer to a worker's
message raised); what to do about it is decided by
:class:`~forgezero_lifecycle.serve.machine.SupervisorMachine`, never here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Final, Literal, final, get_args

from .._errors import DrainFailedError
from ..asgi._in_flight import MAX_ITEMS
from ..core.drain import DrainController
from ..core.self_drain import UNKNOWN_REVISION
from ..stop.server import Tally
from ..wire import paths
from ..wire._protocol import deadline_ms
from ..wire.drain import (
    DRAIN_PROTOCOL,
    DrainRequest,
    WorkCounters,
)
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
from .forking import ForkedProcess, PreloadProcess
from .options import ServeOptions

__all__ = [
    "COMMAND_TIMEOUT",
    "Answer",
    "DrainHook",
    "DrainReport",
    "Generation",
    "HandlerFailed",
    "WorkerHandle",
    "answer_bound",
    "exit_reason",
]


logger = logging.getLogger("forgezero_lifecycle.serve.supervisor")


# The supervisor's handle on one worker process.


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
        self.process: asyncio.subprocess.Process | ForkedProcess | None = None
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
        self._on_ready = self._on_report = self._on_exit = _ignored
        self._on_failure = _ignored
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
        self,
        listeners: Sequence[socket.socket],
        config: dict[str, Any],
        tally: int,
        preload: PreloadProcess | None = None,
    ) -> None:
        """Start the process; ``tally`` is the descriptor of its generation's tally. With
        ``preload`` it is forked from that process (:mod:`.preload`), else spawned."""
        ours, theirs = socket.socketpair()
        try:
            if preload is not None:
                self.process = await preload.fork(theirs)
            else:
                fds = [sock.fileno() for sock in listeners]
                command = [
                    sys.executable, "-m", "forgezero_lifecycle.serve.worker",
                    "--channel-fd", str(theirs.fileno()), "--supervisor-pid", str(os.getpid()),
                    *(f"--listen-fd={fd}" for fd in fds), "--tally-fd", str(tally),
                ]  # fmt: skip
                self.process = await asyncio.create_subprocess_exec(
                    *command,
                    pass_fds=(theirs.fileno(), *fds, tally),
                    stdin=asyncio.subprocess.DEVNULL,
                )
        except BaseException:
            ours.close()
            raise
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
        self.exit_reason = (
            "exited, its status unknown (its preload process was gone)"
            if code is None
            else exit_reason(code)
        )
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

    @property
    def running(self) -> bool:
        """Its process was started and has not exited, as far as the supervisor knows."""
        process = self.process
        if isinstance(process, ForkedProcess):
            return process.running
        return process is not None and process.returncode is None

    def signal(self, signum: int) -> None:
        if self.process is not None and self.running:
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


def _ignored(*_: object) -> None:
    return None


async def _answer_nothing(*_: object) -> dict[str, Any]:
    return {"error": "RUNTIME_WORKER_GONE"}


# One generation: its workers, and the drain they share.

#: ``on_drain(generation, "begun" | "rolled-back")``.
DrainHook = Callable[[int, Literal["begun", "rolled-back"]], None]


@final
class Generation:
    """N workers on the held sockets, one revision, one drain."""

    def __init__(
        self,
        number: int,
        *,
        app: str,
        options: ServeOptions,
        listeners: Sequence[socket.socket],
        on_ready: Callable[[WorkerHandle], None],
        on_exit: Callable[[WorkerHandle], None],
        on_drain: DrainHook,
        on_failure: HandlerFailed,
        on_limit: Callable[[WorkerHandle, str], None] | None = None,
    ) -> None:
        assert options.workers is not None
        self.number = number
        self.revision = options.revision
        self._app = app
        self._options = options
        #: The options as every worker of the generation reads them (built once: a recycle
        #: starts a worker several times a second).
        self._options_wire = dataclasses.asdict(options)
        self._listeners = listeners
        self._on_ready = on_ready
        self._on_exit = on_exit
        self._on_drain = on_drain
        self._on_failure = on_failure
        self._on_limit = on_limit
        self._answer: Answer | None = None
        self.workers: list[WorkerHandle] = []
        self._changed = asyncio.Event()
        self._acks: list[tuple[WorkerHandle, asyncio.Future[dict[str, Any]]]] = []
        self._nonce: str | None = None
        #: The workers the running drain waits for: those ready when it began (a worker not
        #: ready holds no admitted work).
        self._drained_by: list[WorkerHandle] = []
        #: Workers of the running drain replaced meanwhile: still shown in its status.
        self._lost: list[WorkerHandle] = []
        self._fan_out = _FanOut(self)
        self.controller = DrainController(self._fan_out, revision=self.revision)
        # Each worker's open connections, so a burst spreads over them (stop.server): a slot
        # for each place a worker may take, with room for those replaced or added meanwhile.
        self._tally_slots = 2 * options.workers + 2
        self.tally, self._tally_file = Tally.create(self._tally_slots)
        #: ``--preload``: the process its workers are forked from, started with the first
        #: (None once it could not start or is gone: workers are spawned).
        self._preload: asyncio.Task[PreloadProcess | None] | None = None

    def __repr__(self) -> str:
        return f"generation {self.number}"

    @property
    def pids(self) -> list[int | None]:
        return [worker.pid for worker in self.workers]

    def connect(self, answer: Answer) -> None:
        """Where the control calls the workers forward go (set once, before any worker)."""
        self._answer = answer

    def changed(self, _: WorkerHandle | None = None) -> None:
        self._changed.set()

    def _handle(self, index: int) -> WorkerHandle:
        assert self._answer is not None, "connect() the generation before its workers start"
        return WorkerHandle(
            index,
            self.number,
            answer=self._answer,
            on_ready=self._on_ready,
            on_report=self.changed,
            on_exit=self._exited,
            on_failure=self._on_failure,
            on_limit=self._on_limit,
        )

    def _exited(self, worker: WorkerHandle) -> None:
        self.tally.clear(worker.index)  # its count no longer holds its siblings back
        self.changed()
        self._on_exit(worker)

    def _config(self, worker: WorkerHandle) -> dict[str, Any]:
        return {
            "app": self._app,
            "options": self._options_wire,
            "index": worker.index,
            "generation": self.number,
            "tallySlots": self._tally_slots,
        }

    def prepare(self, workers: int) -> list[WorkerHandle]:
        """A handle for each of ``workers`` workers, none started yet."""
        self.workers = [self._handle(index) for index in range(workers)]
        return self.workers

    def place(self, index: int) -> None:
        """Handles up to place ``index`` (a worker added, or a replacement in a new place)."""
        self.workers += [self._handle(i) for i in range(len(self.workers), index + 1)]

    def forgo_worker(self, index: int) -> WorkerHandle:
        """A fresh handle in ``index``'s place that will never be started."""
        self.place(index)
        self.workers[index] = self._handle(index)
        return self.workers[index]

    async def start_worker(self, index: int) -> WorkerHandle:
        """Start worker ``index`` (a fresh process in its place); it reports ready or exits."""
        self.place(index)
        if self.workers[index].process is not None:
            if self.controller.active and self.workers[index] in self._drained_by:
                self._lost.append(self.workers[index])
            self.workers[index] = self._handle(index)
        worker = self.workers[index]
        preload = await self._preloaded()
        await worker.spawn(
            self._listeners, self._config(worker), self._tally_file.fileno(), preload
        )
        return worker

    async def _preloaded(self) -> PreloadProcess | None:
        """With ``--preload``, the generation's preload process once it imported the app
        (started by the first worker's start; None when it could not, or is gone)."""
        if not self._options.preload:
            return None
        if self._preload is None:
            config = {"app": self._app, "options": self._options_wire}
            self._preload = asyncio.ensure_future(
                PreloadProcess.start(
                    self.number, config, self._listeners, self._tally_file.fileno()
                )
            )
        preload = await asyncio.shield(self._preload)
        return preload if preload is not None and preload.serving else None

    async def aclose_preload(self) -> None:
        """Let the preload process go (its workers are gone) and wait until it exited."""
        task, self._preload = self._preload, None
        if task is None:
            return
        task.cancel()  # still importing: it is killed (a no-op once it is done)
        await asyncio.wait([task])
        if task.cancelled() or task.exception() is not None:
            return
        preload = task.result()
        if preload is not None:
            await preload.aclose()

    def close(self) -> None:
        """Release what the generation holds (once forgotten: its workers are gone), and every
        reference back to it, so that dropping it frees it at once (the cyclic collector would
        take it back only at a full collection, rare in a long-lived supervisor)."""
        self.tally.close()
        self._tally_file.close()
        self._fan_out.detach()
        for worker in {*self.workers, *self._drained_by, *self._lost}:
            worker.release()
        self._acks = []

    def ready(self) -> None:
        """Every worker is ready: take the revision they agree on."""
        reported = {worker.revision for worker in self.workers}
        if self.controller.revision is None and len(reported) == 1:
            self.controller.revision = self.revision = reported.pop()
        elif len(reported) > 1:
            logger.warning("supervisor.revisions_differ %r: %s", self, sorted(map(str, reported)))

    # The drain, for the whole generation.

    def begin_drain(self, timeout: float, *, target: str | None) -> bool:
        """Begin the generation's drain under ``timeout``; False when one is running already."""
        if self.controller.active:
            logger.info("supervisor.following_drain generation=%d", self.number)
            return False
        timeout_ms = deadline_ms(timeout)
        self.controller.begin(
            {
                "protocol": DRAIN_PROTOCOL,
                "nonce": secrets.token_urlsafe(32),
                "sourceRevision": self.revision or UNKNOWN_REVISION,
                "targetRevision": target or UNKNOWN_REVISION,
                "timeoutMs": timeout_ms,
            }
        )
        return True

    async def join_drain(self, worker: WorkerHandle) -> None:
        """A replacement, ready while the generation's drain holds it (running, drained or
        failed, not rolled back): it begins the same drain before it accepts, so it refuses
        intake like its siblings, and the rollback reaches it too."""
        if not self.controller.active:
            return
        status = self.controller.current()
        request = DrainRequest.model_validate(
            status.model_dump(by_alias=True, include=set(DrainRequest.model_fields))
        )
        worker.drain_begun(request.nonce)
        self._drained_by.append(worker)
        answer = await worker.command("begin", request=request.model_dump(by_alias=True))
        if "error" in answer and answer["error"] != "RUNTIME_WORKER_GONE":
            logger.error("supervisor.command_refused %s code=%s", worker.name, answer["error"])
            worker.drain_refused(str(answer["error"]))
        logger.info("supervisor.drain_joined %s nonce=%s", worker.name, request.nonce[:8])
        self.changed()

    def fan_out(self, op: str, **fields: Any) -> None:
        self._acks = [
            (worker, asyncio.ensure_future(worker.command(op, **fields)))
            for worker in self._drained_by
            if not worker.exited.is_set()
        ]

    async def acknowledged(self) -> None:
        """Wait until every worker answered the last begin or rollback."""
        acks, self._acks = self._acks, []
        answers = await asyncio.gather(*(ack for _, ack in acks))
        for (worker, _), answer in zip(acks, answers, strict=True):
            if "error" in answer and answer["error"] != "RUNTIME_WORKER_GONE":
                logger.error("supervisor.command_refused %s code=%s", worker.name, answer["error"])
                worker.drain_refused(str(answer["error"]))
                self.changed()

    async def wait_drained(self) -> None:
        """Return once every worker drained; raise as soon as one failed or died."""
        while True:
            self._changed.clear()
            for worker in self._drained_by:
                if worker.report == "failed" or (
                    worker.exited.is_set() and worker.report != "drained"
                ):
                    raise DrainFailedError("RUNTIME_DRAIN_FAILED", detail=f"{worker.name} failed")
            if all(worker.report == "drained" for worker in self._drained_by):
                return
            await self._changed.wait()

    def in_flight(self) -> WorkCounters:
        totals = dict.fromkeys(COUNTER_KINDS, 0)
        for worker in self.workers:
            if not worker.exited.is_set():
                for kind in COUNTER_KINDS:
                    totals[kind] += int(worker.in_flight.get(kind, 0))
        return WorkCounters(**totals)

    def detail(self) -> dict[str, Any]:
        """The per-worker picture a status carries in ``detail``."""
        shown = [*self.workers, *self._lost]
        found: dict[str, Any] = {
            "generation": self.number,
            "workers": [worker.summary() for worker in shown],
        }
        failed = sorted({w.index for w in shown if w.report == "failed" or w.exited.is_set()})
        if failed and self.controller.active:
            found["failedWorkers"] = failed
        oldest = sorted(
            (
                {**item, "worker": worker.index}
                for worker in self.workers
                if not worker.exited.is_set()
                for item in worker.oldest_in_flight
                if isinstance(item, dict)
            ),
            key=lambda item: (item.get("ageMs") is None, -(item.get("ageMs") or 0)),
        )
        if oldest:
            found["oldestInFlight"] = oldest[:MAX_ITEMS]
        return found

    def _drain_requests(self) -> None:
        status = self.controller.current()  # the drain being begun
        request = DrainRequest.model_validate(
            status.model_dump(by_alias=True, include=set(DrainRequest.model_fields))
        )
        self._nonce = request.nonce
        self._lost = []
        # A worker leaving alone (recycled, scaled down) drains on its own bound; one gone for
        # good (killed unresponsive, its place not taken again yet) holds nothing.
        self._drained_by = [
            w for w in self.workers if w.ready.is_set() and not w.retiring and not w.exited.is_set()
        ]
        for worker in self._drained_by:
            worker.drain_begun(request.nonce)
        self.fan_out("begin", request=request.model_dump(by_alias=True))
        logger.info(
            "supervisor.drain_begin generation=%d workers=%d nonce=%s",
            self.number,
            len(self._drained_by),
            request.nonce[:8],
        )
        self._on_drain(self.number, "begun")

    def _resume(self) -> None:
        self._lost = []
        for worker in self._drained_by:
            worker.rolled_back()
        assert self._nonce is not None
        self.fan_out("rollback", nonce=self._nonce)
        self._on_drain(self.number, "rolled-back")


@final
class _FanOut:
    """The generation's drain dependencies: every call reaches every worker. Once the
    generation is forgotten (:meth:`detach`) it has no workers: nothing to reach or wait for."""

    __slots__ = ("_generation",)

    def __init__(self, generation: Generation) -> None:
        self._generation: Generation | None = generation

    def detach(self) -> None:
        self._generation = None

    def drain_requests(self) -> None:
        if self._generation is not None:
            self._generation._drain_requests()

    def wait_for_requests(self) -> Coroutine[Any, Any, None]:
        return _nothing() if self._generation is None else self._generation.wait_drained()

    def stop_jobs(self, timeout_ms: int) -> Coroutine[Any, Any, None]:
        return _nothing()  # each worker's own drain waits for (or releases) its jobs

    def work_counters(self) -> WorkCounters:
        if self._generation is None:
            return WorkCounters(**dict.fromkeys(COUNTER_KINDS, 0))
        return self._generation.in_flight()

    def sleep(self, ms: int) -> Coroutine[Any, Any, None]:
        return asyncio.sleep(ms / 1000)

    def resume(self) -> None:
        if self._generation is not None:
            self._generation._resume()


async def _nothing() -> None:
    return None
