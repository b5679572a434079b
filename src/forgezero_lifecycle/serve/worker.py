"""One worker process of a supervised generation (``serve --workers N``).

Started by the supervisor as ``python -m forgezero_lifecycle.serve.worker`` with the listening
sockets and one end of its private channel passed as file descriptors (or, with ``--preload``,
forked from its generation's preload process with the app imported already: :mod:`.preload`,
which calls :func:`start`). It reads its configuration from the channel, imports the app
(fresh code on every start), and serves it on the inherited
sockets with :func:`~forgezero_lifecycle.serve.server.serve_app` (``shared_listener=True``: its
stop never touches the kernel socket the supervisor holds).

What the supervisor sees (events on the channel)::

    booting ──▶ ready ──▶ draining ──▶ drained | failed | rolled-back

A ready worker serves only its private listener until the supervisor commands ``accept`` (once
every worker of its generation is ready): then it accepts on the shared listeners too. Until
then the connections wait in the kernel's accept queue, so the first worker to be ready does not
take a whole burst of keep-alive clients for itself. It accepts one connection a wake-up, and
leaves a queued one to a sibling that holds fewer (the generation's
:class:`~forgezero_lifecycle.stop.server.Tally`, passed as ``--tally-fd``). The commands are a
dispatch table (:data:`~forgezero_lifecycle.serve.channel.COMMANDS`); a malformed command is
answered ``RUNTIME_BAD_MESSAGE`` and changes nothing.

A ``stop`` that comes while the worker still imports the app or runs its lifespan startup
(booting) is remembered: once the import is over it does not serve, and once the startup is
over it stops (its lifespan shutdown runs) without reporting ready. The supervisor kills a
worker that is still booting when the stop's bound is over.

Signals are the supervisor's to command. SIGINT (a terminal's Ctrl-C reaches the whole process
group) and SIGTERM are blocked only until the worker's event loop runs: then its own handlers
are installed (``serve_app`` installs none) and the signals are unblocked, before the app is
imported, so no process the app starts inherits a blocked signal (a handled signal is reset to
its default by ``exec``). SIGINT is ignored, and SIGTERM too while the supervisor lives. The
worker acts on the channel instead. The inherited listening sockets and the channel are made
close-on-exec as the worker starts: a process the app starts (``os.system("… &")`` closes
nothing) holds neither the port nor the supervisor's channel. It stops when told to, or when the supervisor is gone (end of
file on the channel, the parent-death signal ``PR_SET_PDEATHSIG`` on Linux, or a SIGTERM once the
parent is gone): it then drains itself (or follows the drain begun) and lets ``serve_app`` run
its stop, which leaves the shared kernel socket to the others.

The generation-wide paths of the control plane (the drain paths, ``schedules``, ``metrics``
and ``supervisor/v1/*``) are answered for the whole generation: :class:`GenerationControl`
serves them with the app its runtime built
(:meth:`~forgezero_lifecycle.asgi.control.ControlApp.for_generation`), so the token, the Host
and forwarding-header rules of ``--insecure-loopback-control``, the content type, the body's
size and time bounds and every error code are the single-process ones, applied here before
anything crosses the channel. What crosses it is one small typed call::

    {"op": "control", "call": "drain.status", "args": {"nonce": "..."}}

answered by the supervisor (:class:`~.supervisor.ForwardedControl`). A supervisor that does not
answer within :data:`FORWARD_TIMEOUT` is a 503 ``RUNTIME_SUPERVISOR_UNAVAILABLE``.

Recycling limits (``--max-requests``, ``--max-worker-memory``, ``--max-worker-lifetime``): the
worker only reports (a :class:`~.channel.LimitReport`) that it passed one (:class:`LimitWatch`);
what happens then is the supervisor's to decide
(:class:`~forgezero_lifecycle.serve.machine.SupervisorMachine`): a replacement starts, accepts,
and only then does this worker stop accepting, hand its keep-alive clients over and drain. While
it still accepts (the supervisor replaces one worker at a time, and not during a handover), it
reports again every :data:`REPORT_AGAIN` seconds. Requests are counted by
:class:`RequestCounter`, a pure ASGI wrapper around the app only when ``--max-requests`` is
given: one integer increment per request or WebSocket session, before the app (and the drain
middleware inside it) sees it. Memory (resident set, ``/proc/self/statm``) and lifetime (from
the moment the worker begins to accept) are looked at every :data:`LOOK` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Literal, final

import orjson
import uvicorn

from .._errors import (
    LifecycleError,
)
from .._internals import uvicorn as _uvicorn
from ..asgi._paths import app_path
from ..asgi._types import ASGIApp, Receive, Scope, Send
from ..asgi.control import GENERATION_PATHS, Answer, ControlApp
from ..runtime import Runtime
from ..stop.server import Tally, ZeroLossServer, accept_one_at_a_time
from ..wire import paths
from .channel import Channel, ChannelClosedError, LimitReport, StateReport, read_frame_blocking
from .options import ServeOptions, loop_factory, options_from_wire
from .server import drain_then_stop, load_app, serve_app

__all__ = [
    "FORWARD_TIMEOUT",
    "LOOK",
    "PARENT_DEATH_SIGNAL",
    "REPORT_AGAIN",
    "GenerationControl",
    "LimitWatch",
    "RequestCounter",
    "main",
    "resident_mib",
    "start",
    "started_by_supervisor",
]


logger = logging.getLogger("forgezero_lifecycle.serve.worker")

#: Sent to a worker by the kernel when the supervisor dies (``PR_SET_PDEATHSIG``).
PARENT_DEATH_SIGNAL: Final = signal.SIGUSR1
_PR_SET_PDEATHSIG: Final = 1
_COMMANDED: Final = {signal.SIGINT, signal.SIGTERM}
#: How often the worker looks whether uvicorn has finished starting (it offers no event).
_STARTUP_LOOK: Final = 0.02


def _set_parent_death_signal(signum: int) -> None:
    """Ask Linux to send ``signum`` when the parent dies; a no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        logger.warning("worker.pdeathsig_unavailable errno=%d", ctypes.get_errno())


@final
class WorkerAgent:
    """This worker's side of the channel: state events, and the supervisor's commands."""

    def __init__(
        self,
        runtime: Runtime,
        channel: Channel,
        options: ServeOptions,
        *,
        index: int,
        generation: int,
        private: socket.socket,
        supervisor_pid: int,
        limits: LimitWatch | None = None,
    ) -> None:
        self.runtime = runtime
        #: Its recycling limits (reported once it accepts).
        self.limits = limits or LimitWatch(options, lambda why: None)
        self.channel = channel
        self.options = options
        self.private = private
        self.supervisor_pid = supervisor_pid
        self.index = index
        self.generation = generation
        self.server: uvicorn.Server | None = None
        self.shared: list[socket.socket] = []
        #: The generation's tally of open connections (the shared listeners are balanced on it).
        self.tally: Tally | None = None
        self._accepting = False
        self._stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()

    def attach_server(self, server: uvicorn.Server) -> None:
        self.server = server
        if self._stopping:
            server.should_exit = True  # told to stop before its server was built

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def notify_state(self, report: StateReport) -> None:
        self.channel.notify(report.wire())

    async def watch_startup(self, serving: asyncio.Task[int]) -> None:
        """Once uvicorn serves (startup and lifespan done): report ready."""
        while not serving.done():
            if self.server is not None and self.server.started:
                if self._stopping:  # told to stop while it started: uvicorn stops it now
                    return
                # Plain HTTP even when the shared listeners are TLS: the next generation fetches
                # the state export from it over loopback http (:func:`~.supervisor.hand_state_over`).
                await _uvicorn.accept_on(self.server, [self.private], tls=False)
                if self.tally is not None:
                    # Ready: a sibling told to accept before this one acts on it (its loop
                    # busy, on a loaded machine) leaves it its share of a burst from now on.
                    self.tally.publish(0)
                self.notify_state(
                    StateReport(
                        "ready",
                        pid=os.getpid(),
                        in_flight=self.runtime.in_flight().model_dump(),
                        private_port=self.private.getsockname()[1],
                        state_kind=_state_kind(self.runtime),
                        revision=self.runtime.revision,
                    )
                )
                return
            await asyncio.sleep(_STARTUP_LOOK)

    def on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGTERM and os.getppid() != self.supervisor_pid:
            self.stop(f"{name} and the supervisor is gone")
            return
        logger.info("worker.signal_ignored signal=%s: the supervisor commands this worker", name)

    def stop(self, reason: str, *, force: bool = False) -> None:
        """Drain (or follow the drain begun), then stop serving; ``force``: stop now."""
        server = self.server
        if force and server is not None:
            logger.warning("worker.forced worker=%d reason=%s", self.index, reason)
            server.force_exit = True
            server.should_exit = True
            return
        if self._stopping:
            return
        self._stopping = True
        self.limits.stop()
        logger.info("worker.stopping worker=%d reason=%s", self.index, reason)
        if server is None or not server.started:
            # Still starting, nothing admitted to drain: once uvicorn's startup (the app's
            # lifespan startup) is over it stops instead of serving, and runs the lifespan's
            # shutdown (:meth:`watch_startup` neither opens the private listener nor reports
            # ready). A server not built yet is told as it is attached.
            logger.info(
                "worker.stopped_before_serving worker=%d: still starting; it stops once its "
                "startup is over",
                self.index,
            )
            if server is not None:
                server.should_exit = True
            return
        self._spawn(drain_then_stop(self.runtime, self.options.drain_timeout, server))

    async def handle(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """Answer one of the supervisor's commands (:data:`~.channel.COMMANDS`)."""
        op = message.get("op")
        handler = self._commands.get(op) if isinstance(op, str) else None
        if handler is None:
            return {"error": "RUNTIME_NOT_FOUND", "detail": f"unknown op {op!r}"}
        try:
            return await handler(message)
        except (KeyError, TypeError, ValueError) as error:
            logger.error("worker.bad_command op=%s: %r", op, error)
            return {"error": "RUNTIME_BAD_MESSAGE", "detail": f"{op}: {type(error).__name__}"}

    async def _begin(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            accepted = self.runtime.drain.begin(message["request"])
        except LifecycleError as error:
            return {"error": error.code, "detail": error.detail}
        if not accepted.duplicate:
            self._spawn(self._report_drain(message["request"]["nonce"]))
        return {"ok": True, "duplicate": accepted.duplicate}

    async def _rollback(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            self.runtime.drain.rollback(message["nonce"])
        except LifecycleError as error:
            return {"error": error.code}
        return {"ok": True, "inFlight": self.runtime.in_flight().model_dump()}

    async def _status(self, message: dict[str, Any]) -> dict[str, Any]:
        return {
            "inFlight": self.runtime.in_flight().model_dump(),
            "oldestInFlight": self.runtime.oldest_in_flight(),
        }

    async def _schedules(self, message: dict[str, Any]) -> dict[str, Any]:
        return {"schedules": self.runtime.scheduled_jobs()}

    async def _metrics(self, message: dict[str, Any]) -> dict[str, Any]:
        document = self.runtime.published_document(paths.RUNTIME_METRICS_PATH)
        if document is None:
            return {"text": None}
        return {"text": document()[0].decode("utf-8")}

    async def _import_state(self, message: dict[str, Any]) -> dict[str, Any]:
        return await self._import(message["request"], int(message["timeoutMs"]))

    async def _stop_command(self, message: dict[str, Any]) -> dict[str, Any]:
        self.stop("the supervisor stops this worker", force=bool(message.get("force")))
        return {"ok": True}

    async def _accept_command(self, message: dict[str, Any]) -> dict[str, Any]:
        return await self.accept()

    async def _stop_accepting_command(self, message: dict[str, Any]) -> dict[str, Any]:
        return self._stop_accepting()

    async def _retire_command(self, message: dict[str, Any]) -> dict[str, Any]:
        grace = float(message["grace"])
        if not self._stopping:
            self._spawn(self._retire(grace))
        return {"ok": True}

    async def _retire(self, grace: float) -> None:
        """Leave the generation alone (recycled, scaled down): stop accepting and ask every
        HTTP connection to close (as a handover's old generation does), then, once the grace
        is over and every connection that was idle has closed or carries a request the app runs
        (:meth:`~forgezero_lifecycle.stop.server.ConnectionStop.wait_moved`; at most the
        drain's deadline), drain and stop. A connection accepted just before the listener
        closed is answered with ``Connection: close`` once its first request comes: the drain
        waits for it instead of refusing that request."""
        self._stop_accepting()
        await asyncio.sleep(grace)
        server = self.server
        if isinstance(server, ZeroLossServer):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.options.drain_timeout):
                    await server.zero_loss_stop.wait_moved()
        self.stop("retired: its clients went to its siblings")

    async def _ping(self, message: dict[str, Any]) -> dict[str, Any]:
        """The heartbeat: answered by this event loop, with what the worker holds."""
        return {"ok": True, "inFlight": self.runtime.in_flight().model_dump()}

    @property
    def _commands(self) -> dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]]:
        return {
            "begin": self._begin,
            "rollback": self._rollback,
            "status": self._status,
            "schedules": self._schedules,
            "metrics": self._metrics,
            "import": self._import_state,
            "accept": self._accept_command,
            "stop_accepting": self._stop_accepting_command,
            "stop": self._stop_command,
            "ping": self._ping,
            "retire": self._retire_command,
        }

    async def accept(self) -> dict[str, Any]:
        """Serve on the shared listeners from now on (the supervisor says when: once every
        worker of the generation is ready); until then connections wait in the kernel's queue."""
        server = self.server
        if server is None or not server.started:
            return {"error": "RUNTIME_WORKER_BOOTING"}
        if self._accepting:
            return {"ok": True}
        self._accepting = True
        # One connection per wake-up, so a burst spreads over the generation's workers.
        accept_one_at_a_time(server, self.shared, self.tally)
        logger.info("worker.accepting worker=%d listeners=%d", self.index, len(self.shared))
        self.limits.start()
        return {"ok": True}

    async def _report_drain(self, nonce: str) -> None:
        self.notify_state(StateReport("draining", pid=os.getpid()))
        state = await self.runtime.drain.wait()
        try:
            status = self.runtime.drain.status(nonce)
        except LifecycleError:
            return  # rolled back and begun anew meanwhile: the new drain reports for itself
        self.notify_state(
            StateReport(
                state,
                pid=os.getpid(),
                failure=status.failure,
                in_flight=status.in_flight.model_dump(),
                nonce=nonce,
            )
        )

    async def _import(self, request: dict[str, Any], timeout_ms: int) -> dict[str, Any]:
        """Take the state of the old generation's worker with the same index (over loopback)."""
        handoff = self.runtime.handoff
        if handoff is None:
            return {"error": "RUNTIME_STATE_NOT_FOUND"}
        try:
            handoff.begin(request, timeout_ms)
            status = await handoff.wait(request["nonce"])
        except LifecycleError as error:
            return {"error": error.code}
        return {"status": status.model_dump(mode="json", exclude_none=True)}

    def _stop_accepting(self) -> dict[str, Any]:
        """A handover: stop accepting, ask every HTTP connection to close, readiness stays."""
        server = self.server
        if server is None:
            return {"ok": False}
        self.limits.stop()
        private = self.private.getsockname()
        for listening in server.servers:
            if all(sock.getsockname() != private for sock in listening.sockets):
                listening.close()  # this process's descriptor only: the kernel socket lives on
        self.runtime.gate.begin_draining()  # every response from now on says Connection: close
        # Every HTTP connection moves to the new generation: one busy closes after its response,
        # an idle one after the first-byte grace unless a request comes (answered, then closed),
        # so none is left open for a request the drain would refuse once intake closes.
        connections = server.server_state.connections
        count = sum(_is_http(connection) for connection in connections)
        if isinstance(server, ZeroLossServer):
            server.zero_loss_stop.begin(connections, websockets=False)
        logger.info("worker.stopped_accepting worker=%d connections=%d", self.index, count)
        return {"ok": True, "connections": count}


def _is_http(connection: object) -> bool:
    """An HTTP connection of uvicorn's (a WebSocket session's protocol has no request cycle)."""
    return hasattr(connection, "cycle")


def _state_kind(runtime: Runtime) -> dict[str, Any] | None:
    """The protocol and schema version of the app's state adapter (None without one)."""
    if runtime.handoff is None:
        return None
    handoff = runtime.handoff
    return {"protocol": handoff.protocol, "schemaVersion": handoff.schema_version}


# The generation-wide control paths: checked here, answered by the supervisor.


#: How long a worker waits for the supervisor's answer to one call.
FORWARD_TIMEOUT: Final = 30.0
_UNAVAILABLE: Final = Answer(
    503,
    b'{"error":"RUNTIME_SUPERVISOR_UNAVAILABLE",'
    b'"detail":"the supervisor did not answer; try again"}',
)


@final
class GenerationControl:
    """Pure ASGI, in a worker: the generation-wide control paths go to ``control`` made for the
    generation (checked here, answered by the supervisor), everything else to ``app``."""

    def __init__(self, app: ASGIApp, /, *, channel: Channel, control: ControlApp) -> None:
        self.app = app
        self._channel = channel
        self._control = control.for_generation(self._call)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and app_path(scope).rstrip("/") in GENERATION_PATHS:
            await self._control(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _call(self, call: str, arguments: dict[str, object]) -> Answer:
        try:
            found = await self._channel.request(
                "control", timeout=FORWARD_TIMEOUT, call=call, args=arguments
            )
        except (ChannelClosedError, TimeoutError):
            return _UNAVAILABLE
        return _answer_from_wire(found)


def _answer_from_wire(found: Mapping[str, Any]) -> Answer:
    headers = {str(k).lower(): str(v) for k, v in found.get("headers", ())}
    content_type = headers.pop("content-type", "application/json")
    body = found.get("body")
    encoded = body.encode() if isinstance(body, str) else orjson.dumps(body)
    return Answer(int(found.get("status", 500)), encoded, content_type, tuple(headers.items()))


# The recycling limits: the worker notices, the supervisor replaces.
#: How often memory and lifetime are looked at.
LOOK: Final = 1.0
#: How often a worker past a limit that still accepts reports it again.
REPORT_AGAIN: Final = 5.0
_MIB: Final = 1024 * 1024


def resident_mib() -> float | None:
    """This process's resident memory in MiB (None where ``/proc`` is not there)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            resident = int(statm.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return resident * os.sysconf("SC_PAGE_SIZE") / _MIB


@final
class RequestCounter:
    """Pure ASGI: counts HTTP requests and WebSocket sessions; calls ``on_limit`` once, at the
    ``limit``-th."""

    __slots__ = ("app", "count", "limit", "on_limit")

    def __init__(self, app: ASGIApp, /, *, limit: int, on_limit: Callable[[int], None]) -> None:
        self.app = app
        self.limit = limit
        self.on_limit = on_limit
        self.count = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            self.count += 1
            if self.count == self.limit:
                self.on_limit(self.count)
        await self.app(scope, receive, send)


@final
class LimitWatch:
    """One worker's limits; ``report(why)`` sends the report to the supervisor."""

    def __init__(self, options: ServeOptions, report: Callable[[str], None]) -> None:
        self._options = options
        self._report = report
        #: This worker's request limit: ``--max-requests`` plus its own jitter.
        self.max_requests: int | None = None
        if options.max_requests is not None:
            jitter = options.max_requests_jitter
            self.max_requests = options.max_requests + (random.randint(0, jitter) if jitter else 0)
        self._why: str | None = None
        self._reported = 0.0
        self._accepting_since: float | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def active(self) -> bool:
        options = self._options
        return any(
            limit is not None
            for limit in (self.max_requests, options.max_worker_memory, options.max_worker_lifetime)
        )

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """``app`` with its requests counted (itself when there is no request limit)."""
        if self.max_requests is None:
            return app
        return RequestCounter(app, limit=self.max_requests, on_limit=self._requests_reached)

    def _requests_reached(self, count: int) -> None:
        self._reached(f"max-requests: {count} requests")

    def _reached(self, why: str) -> None:
        if self._why is None:
            self._why = why
            logger.info("worker.limit_reached %s", why)
            if self._accepting_since is not None:
                self._send()

    def _send(self) -> None:
        assert self._why is not None
        self._reported = time.monotonic()
        self._report(self._why)

    def start(self) -> None:
        """The worker accepts from now on: its lifetime counts, and a limit is reported."""
        if self._accepting_since is not None or not self.active:
            return
        self._accepting_since = time.monotonic()
        if self._why is not None:
            self._send()
        self._task = asyncio.ensure_future(self._watch())

    def stop(self) -> None:
        """The worker no longer accepts: nothing more to report."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _watch(self) -> None:
        assert self._accepting_since is not None
        options = self._options
        limit, lifetime = options.max_worker_memory, options.max_worker_lifetime
        while True:
            await asyncio.sleep(LOOK)
            now = time.monotonic()
            if self._why is None:
                memory = None if limit is None else resident_mib()
                if memory is not None and limit is not None and memory > limit:
                    self._reached(f"max-worker-memory: {memory:.0f} MiB resident")
                elif lifetime is not None and now - self._accepting_since >= lifetime:
                    self._reached(f"max-worker-lifetime: {lifetime:g} s")
            elif now - self._reported >= REPORT_AGAIN:
                self._send()


def started_by_supervisor(
    prog: str, argv: Sequence[str] | None, death_signal: int
) -> argparse.Namespace | None:
    """What a process the supervisor starts (a worker, a preload process) does first: read the
    descriptors it was passed, block the signals the supervisor commands and arm
    ``death_signal`` for the supervisor's end. None when the supervisor died before that."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--listen-fd", type=int, action="append", default=[])
    parser.add_argument("--supervisor-pid", type=int, required=True)
    parser.add_argument("--tally-fd", type=int, default=None)
    args = parser.parse_args(argv)
    signal.pthread_sigmask(signal.SIG_BLOCK, _COMMANDED)
    _set_parent_death_signal(death_signal)
    return args if os.getppid() == args.supervisor_pid else None


def main(argv: Sequence[str] | None = None) -> int:
    """The worker process (see the module docstring); returns its exit code."""
    args = started_by_supervisor("forgezero_lifecycle.serve.worker", argv, PARENT_DEATH_SIGNAL)
    if args is None:
        return 1  # the supervisor died before the parent-death signal was armed
    return start(args.channel_fd, args.listen_fd, args.tally_fd, parent=args.supervisor_pid)


def start(
    channel_fd: int,
    listen_fds: Sequence[int],
    tally_fd: int | None,
    *,
    parent: int,
    preloaded: tuple[ASGIApp, Runtime, Literal["app", "serve"]] | None = None,
) -> int:
    """Serve as worker on the descriptors given until stopped; returns the exit code.
    ``parent``: the process whose end means the supervisor's (the supervisor, or the preload
    process a worker was forked from); ``preloaded``: what ``load_app`` gave the preload
    process (:mod:`.preload`), or None to import the app here."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _COMMANDED)
    channel_sock = socket.socket(fileno=channel_fd)
    try:
        config = read_frame_blocking(channel_sock)
    except (ChannelClosedError, OSError):
        return 1
    options = options_from_wire(config["options"])
    label = f"worker={config['index']} generation={config['generation']}"
    options = dataclasses.replace(options, log_label=label)
    for fd in (channel_fd, *listen_fds):
        os.set_inheritable(fd, False)  # passed to this process, never to those the app starts
    listeners = [socket.socket(fileno=fd) for fd in listen_fds]
    # A slot in the generation's tally for each place up to its size (a worker in a place past
    # them, while several are replaced at once, accepts without one).
    slots = int(config.get("tallySlots") or options.workers or 1)
    index = int(config["index"])
    tally = (
        None
        if tally_fd is None
        else Tally.attach(tally_fd, slots, index if index < slots else None)
    )
    with asyncio.Runner(loop_factory=loop_factory(options.uvicorn.loop)) as runner:
        return runner.run(
            _serve(config, options, listeners, channel_sock, parent, tally, preloaded)
        )


async def _serve(
    config: dict[str, Any],
    options: ServeOptions,
    listeners: list[socket.socket],
    channel_sock: socket.socket,
    supervisor_pid: int,
    tally: Tally | None,
    preloaded: tuple[ASGIApp, Runtime, Literal["app", "serve"]] | None = None,
) -> int:
    index, generation = int(config["index"]), int(config["generation"])
    agent_box: list[WorkerAgent] = []
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if agent_box:
            agent_box[0].on_signal(signum)
        # else: the app failed its import; the worker is exiting anyway

    for signum in _COMMANDED:  # handled from now on: unblocked before the app is imported
        loop.add_signal_handler(signum, on_signal, signum)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _COMMANDED)

    stopped_early: list[str] = []

    async def handle(message: dict[str, Any]) -> dict[str, Any] | None:
        if not agent_box:
            if message.get("op") == "stop":  # remembered: it never serves
                stopped_early.append("the supervisor stopped it while it imported the app")
                return {"ok": True}
            return {"error": "RUNTIME_WORKER_BOOTING"}
        return await agent_box[0].handle(message)

    channel = await Channel.open(channel_sock, handle)
    channel.notify(StateReport("booting", pid=os.getpid()).wire())
    try:
        app, runtime, source = load_app(config["app"], options) if preloaded is None else preloaded
    except LifecycleError as error:
        channel.notify(StateReport("failed", pid=os.getpid(), detail=str(error)).wire())
        logger.error("worker.start_failed worker=%d: %s", index, error)
        await asyncio.sleep(0.05)  # let the event leave before the process does
        return 2
    if stopped_early:  # its lifespan never started: nothing to shut down
        logger.info("worker.stopped_before_serving worker=%d: %s", index, stopped_early[0])
        await channel.aclose()
        return 0
    # A private loopback listener of this worker alone: the next generation's worker with the
    # same index fetches this one's state export from it during a handover.
    private = socket.create_server(("127.0.0.1", 0))
    runtime.supervised = True  # its siblings on the socket drain with it, as one generation
    limits = LimitWatch(options, lambda why: channel.notify(LimitReport(why).wire()))
    agent = WorkerAgent(
        runtime,
        channel,
        options,
        index=index,
        generation=generation,
        private=private,
        supervisor_pid=supervisor_pid,
        limits=limits,
    )
    agent.shared = listeners
    agent.tally = tally
    agent_box.append(agent)
    loop.add_signal_handler(PARENT_DEATH_SIGNAL, agent.stop, "the supervisor is gone")
    serving = asyncio.create_task(
        serve_app(
            GenerationControl(limits.wrap(app), channel=channel, control=runtime.control),
            runtime,
            options,
            sockets=[],  # the private listener once started, the shared ones on accept
            shared_listener=True,
            runtime_source=source,
            on_server=agent.attach_server,
            handle_signals=False,
        )
    )
    startup = asyncio.create_task(agent.watch_startup(serving))
    orphaned = asyncio.create_task(channel.closed.wait())
    orphaned.add_done_callback(
        lambda done: None if done.cancelled() else agent.stop("the supervisor is gone (EOF)")
    )
    try:
        code = await serving
        server = agent.server
        if server is not None and _uvicorn.shutdown_skipped(server):
            # Stopped during its startup, under a uvicorn that then returns at once: the app's
            # lifespan shutdown still runs, as the stop of a booting worker promises.
            await server.lifespan.shutdown()
        return code
    finally:
        startup.cancel()
        orphaned.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await orphaned
        await channel.aclose()


if __name__ == "__main__":  # pragma: no cover - run by the supervisor
    raise SystemExit(main())
