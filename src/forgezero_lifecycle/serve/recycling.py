"""A worker's recycling limits (``serve --workers`` with ``--max-requests``,
``--max-worker-memory``, ``--max-worker-lifetime``): the worker notices, the supervisor replaces.

The worker only reports (a :class:`~.channel.LimitReport` on its channel) that it passed a
limit; what happens then is the supervisor's to decide
(:class:`~forgezero_lifecycle.serve.machine.SupervisorMachine`): a replacement starts, accepts,
and only then does this worker stop accepting, hand its keep-alive clients over and drain. While
it still accepts (the supervisor replaces one worker at a time, and not during a handover), it
reports again every :data:`REPORT_AGAIN` seconds.

Requests are counted by :class:`RequestCounter`, a pure ASGI wrapper the worker puts around its
app only when ``--max-requests`` is given: one integer increment per request or WebSocket
session, before the app (and the drain middleware inside it) sees it. Memory (resident set,
``/proc/self/statm``) and lifetime (from the moment the worker begins to accept) are looked at
every :data:`LOOK` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Callable
from typing import Final, final

from ..asgi._types import ASGIApp, Receive, Scope, Send
from .options import ServeOptions

__all__ = ["LOOK", "REPORT_AGAIN", "LimitWatch", "RequestCounter", "resident_mib"]

logger = logging.getLogger("forgezero_lifecycle.serve.worker")

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
