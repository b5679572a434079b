"""One generation of a supervised server: N worker processes that drain as one.

The generation owns a :class:`~forgezero_lifecycle.core.drain.DrainController` whose dependencies
fan out to the workers over their private channels: ``begin`` reaches every worker's own runtime
in the same instant with the same request (nonce, revisions, ``timeoutMs``), and the controller
races the same deadline. The public control plane of any worker forwards the drain paths to
the generation, which answers them with the single-process control plane (:mod:`.forwarding`).
Status aggregates: counters are the sums over the workers, ``drained`` only once every worker drained,
``failed`` as soon as one failed or died (``detail.workers`` says which), and rollback rolls
back every worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import socket
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, final

from .._errors import DrainFailedError
from ..core.drain import DrainController
from ..wire.accepted import Accepted
from ..wire.drain import DrainRequest, WorkCounters
from .forwarding import ForwardedControl
from .handovers import HandoverLog
from .options import ServeOptions
from .process import COUNTER_KINDS, StartFailedError, WorkerProcess

__all__ = ["Generation"]

logger = logging.getLogger("forgezero_lifecycle.serve.supervisor")


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
        on_lost: Callable[[WorkerProcess], None],
        on_reload: Callable[[], int | None],
        handovers: HandoverLog,
    ) -> None:
        assert options.workers is not None
        self.number = number
        self.revision = options.revision
        self._app = app
        self._options = options
        self._listeners = listeners
        self._on_lost = on_lost
        self.workers = [WorkerProcess(self, index) for index in range(options.workers)]
        self.retired = False
        self._changed = asyncio.Event()
        self._acks: list[tuple[WorkerProcess, asyncio.Future[dict[str, Any]]]] = []
        self.controller = DrainController(_FanOut(self), revision=self.revision)
        self.forwarded = ForwardedControl(self, options, on_reload=on_reload, handovers=handovers)

    def __repr__(self) -> str:
        return f"generation {self.number}"

    @property
    def pids(self) -> list[int | None]:
        return [worker.pid for worker in self.workers]

    def changed(self) -> None:
        self._changed.set()

    def _config(self, worker: WorkerProcess) -> dict[str, Any]:
        return {
            "app": self._app,
            "options": dataclasses.asdict(self._options),
            "index": worker.index,
            "generation": self.number,
        }

    async def start(self) -> None:
        """Start every worker; raise :class:`StartFailedError` unless all are ready in time."""
        await asyncio.gather(*(self.start_worker(worker) for worker in self.workers))
        reported = {worker.revision for worker in self.workers}
        if self.controller.revision is None and len(reported) == 1:
            self.controller.revision = self.revision = reported.pop()
        elif len(reported) > 1:
            logger.warning("supervisor.revisions_differ %r: %s", self, sorted(map(str, reported)))

    async def start_worker(self, worker: WorkerProcess) -> None:
        await worker.spawn(self._listeners, self._config(worker))
        ready = asyncio.ensure_future(worker.ready.wait())
        gone = asyncio.ensure_future(worker.exited.wait())
        try:
            await asyncio.wait(
                (ready, gone),
                timeout=self._options.start_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            ready.cancel()
            gone.cancel()
        if worker.ready.is_set() and not worker.exited.is_set():
            logger.info("supervisor.worker_ready %s", worker.name)
            return
        if worker.exited.is_set():
            why = f"exited ({worker.exit_reason}) before it was ready"
        elif worker.state == "failed":
            why = "failed to start"
        else:
            why = f"was not ready within {self._options.start_timeout:g} s"
        if worker.detail:
            why += f": {worker.detail}"
        raise StartFailedError(f"{worker.name} {why}")

    def worker_exited(self, worker: WorkerProcess) -> None:
        self.changed()
        if worker.stopping or self.retired:
            logger.info("supervisor.worker_exited %s reason=%s", worker.name, worker.exit_reason)
            return
        if worker.ready.is_set() and not self.controller.active:
            self._on_lost(worker)
        else:
            logger.error("supervisor.worker_died %s reason=%s", worker.name, worker.exit_reason)

    def replace(self, lost: WorkerProcess) -> WorkerProcess:
        """A fresh worker in ``lost``'s place (the caller starts it)."""
        fresh = WorkerProcess(self, lost.index)
        self.workers[lost.index] = fresh
        return fresh

    # The drain, for the whole generation.

    @property
    def request(self) -> DrainRequest | None:
        """The drain request the controller holds (the one being begun, during ``begin``)."""
        return self.controller._request

    def begin(self, request: dict[str, Any]) -> Accepted:
        """Begin (or acknowledge a retry of) the generation's drain; the controller validates."""
        return self.controller.begin(request)

    def fan_out(self, op: str, **fields: Any) -> None:
        self._acks = [
            (worker, asyncio.ensure_future(worker.command(op, **fields)))
            for worker in self.workers
            if not worker.exited.is_set()
        ]

    async def acknowledged(self) -> None:
        """Wait until every worker answered the last begin or rollback."""
        acks, self._acks = self._acks, []
        answers = await asyncio.gather(*(ack for _, ack in acks))
        for (worker, _), answer in zip(acks, answers, strict=True):
            if "error" in answer and answer["error"] != "RUNTIME_WORKER_GONE":
                logger.error("supervisor.command_refused %s code=%s", worker.name, answer["error"])
                if worker.state == "draining":  # a refused begin: this worker will not drain
                    worker.state, worker.failure = "failed", answer["error"]
                    self.changed()

    async def wait_drained(self) -> None:
        """Return once every worker drained; raise as soon as one failed or died."""
        while True:
            self._changed.clear()
            for worker in self.workers:
                if worker.state == "failed" or (
                    worker.exited.is_set() and worker.state != "drained"
                ):
                    raise DrainFailedError("RUNTIME_DRAIN_FAILED", detail=f"{worker.name} failed")
            if all(worker.state == "drained" for worker in self.workers):
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
        found: dict[str, Any] = {
            "generation": self.number,
            "workers": [worker.summary() for worker in self.workers],
        }
        failed = [w.index for w in self.workers if w.state == "failed" or w.exited.is_set()]
        if failed and self.controller.active:
            found["failedWorkers"] = failed
        return found

    # Stopping.

    async def stop(self, bound: float, *, force: bool = False) -> None:
        """Ask every worker to stop, wait (bounded), kill what is left; never raises."""
        self.retired = True
        for worker in self.workers:
            worker.stopping = True
        await asyncio.gather(
            *(worker.command("stop", force=force) for worker in self.workers),
            return_exceptions=True,
        )
        waits = [asyncio.ensure_future(w.exited.wait()) for w in self.workers]
        _, pending = await asyncio.wait(waits, timeout=bound)
        for waiting in pending:
            waiting.cancel()
        for worker in self.workers:
            if not worker.exited.is_set():
                logger.error(
                    "supervisor.worker_killed %s: not stopped within %.1f s", worker.name, bound
                )
                worker.signal(signal.SIGKILL)
        await asyncio.gather(*(w.exited.wait() for w in self.workers if w.process is not None))


@final
class _FanOut:
    """The generation's drain dependencies: every call reaches every worker."""

    __slots__ = ("_generation",)

    def __init__(self, generation: Generation) -> None:
        self._generation = generation

    def drain_requests(self) -> None:
        generation = self._generation
        assert generation.request is not None
        request = generation.request.model_dump(by_alias=True)
        for worker in generation.workers:
            worker.state = "draining"
        generation.fan_out("begin", request=request)
        logger.info(
            "supervisor.drain_begin generation=%d workers=%d nonce=%s",
            generation.number,
            len(generation.workers),
            generation.request.nonce[:8],
        )

    def wait_for_requests(self) -> Coroutine[Any, Any, None]:
        return self._generation.wait_drained()

    def stop_jobs(self, timeout_ms: int) -> Coroutine[Any, Any, None]:
        return _nothing()  # each worker's own drain waits for (or releases) its jobs

    def work_counters(self) -> WorkCounters:
        return self._generation.in_flight()

    def sleep(self, ms: int) -> Coroutine[Any, Any, None]:
        return asyncio.sleep(ms / 1000)

    def resume(self) -> None:
        generation = self._generation
        assert generation.request is not None
        for worker in generation.workers:
            if not worker.exited.is_set():
                worker.state = "ready"
        generation.fan_out("rollback", nonce=generation.request.nonce)


async def _nothing() -> None:
    return None
