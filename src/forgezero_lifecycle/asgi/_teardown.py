"""The bounded teardown: the app's lifespan shutdown, right after the drain, within its bound.

Where the runtime owns the stop (``forgezero-lifecycle serve``, and the signal hook under
uvicorn, hypercorn and gunicorn's worker), a stop goes in this order (docs/long-lived-work.md)::

    drain         requests, WebSockets and streams; background work (create_task, hold)
    teardown      the app's lifespan shutdown, within what is left of the deadline + margin
    connections   the server's own stop: stop accepting, close what is left, exit

The in-flight middleware runs the app's lifespan in a task of its own (:meth:`Teardown.run`),
so once the drain settled :meth:`Teardown.shut_down` can hand the app its ``lifespan.shutdown``
before the server's stop begins, and wait for its answer within the bound. The server's own
``lifespan.shutdown`` comes later and is answered from what the app answered then: complete, or
``lifespan.shutdown.failed`` when the app failed it or overran its bound. One that overran is
logged (``teardown.lifespan_overran``) and its task cancelled, so a hung shutdown cannot hang
the stop; ``serve`` then exits 1.

A stop the runtime does not own (no drain began: the server's own SIGTERM without the hook, a
development reload) leaves the lifespan to the server, unbounded, exactly as without the
runtime. A shutdown that blocks the event loop (a synchronous call that never returns) cannot be
bounded from inside the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal, final

from .._clock import Clock
from .._race import first
from ._types import Message, Receive, Send

__all__ = ["Teardown", "TeardownOutcome"]

logger = logging.getLogger("forgezero_lifecycle.teardown")

#: Where the teardown stands: nothing run yet; the app's shutdown answered complete, or failed;
#: the app overran its bound (its lifespan task cancelled).
TeardownOutcome = Literal["pending", "complete", "failed", "overran"]

_SHUTDOWN: Final = {"type": "lifespan.shutdown"}
_ANSWERS: Final = frozenset({"lifespan.shutdown.complete", "lifespan.shutdown.failed"})
#: Seconds a lifespan task cancelled for overrunning has to end before the stop goes on.
_CANCEL_GRACE: Final = 0.5


@final
class Teardown:
    """One per runtime: the app's lifespan, run so that the stop can shut it down first."""

    __slots__ = (
        "_answer",
        "_app",
        "_bound",
        "_clock",
        "_gave_up",
        "_request",
        "_started",
        "detail",
        "outcome",
    )

    def __init__(self, clock: Clock, bound: Callable[[], float]) -> None:
        self._clock = clock
        #: Seconds the app's shutdown may take, asked when it begins.
        self._bound = bound
        self._app: asyncio.Task[None] | None = None
        self._started = False
        self._request = asyncio.Event()
        self._answer = asyncio.Event()
        #: Set when the app overran its bound: the stop answers the server without it.
        self._gave_up = asyncio.Event()
        self.outcome: TeardownOutcome = "pending"
        #: The app's own message when it failed its shutdown.
        self.detail = ""

    @property
    def failed(self) -> bool:
        """The app's shutdown failed or overran its bound: the stop ends with exit 1."""
        return self.outcome in ("failed", "overran")

    @property
    def requested(self) -> bool:
        """:meth:`shut_down` has handed the app its shutdown."""
        return self._request.is_set()

    async def run(self, app_call: Awaitable[None], receive: Receive, send: Send) -> None:
        """Run the app's lifespan (``app_call``, whose receive and send are :meth:`receive`
        and :meth:`send`) in a task of its own; once :meth:`shut_down` ran it, answer the
        server's own ``lifespan.shutdown`` with what the app answered."""
        self._reset()
        task = self._app = asyncio.ensure_future(app_call)
        gave_up = asyncio.ensure_future(self._gave_up.wait())
        try:
            await asyncio.wait((task, gave_up), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()  # the server gave up on its lifespan: the app's goes with it
            raise
        finally:
            gave_up.cancel()
        if task.done():
            self._app = None
            if not task.cancelled():
                task.result()  # the app's own error reaches the server, as without the runtime
            elif self.outcome != "overran":
                raise asyncio.CancelledError
        # else: it overran and ignores its cancel; kept in _app, and the stop goes on.
        if self.outcome == "pending":
            return  # the server's own shutdown reached the app: nothing to answer for it
        await receive()  # the server's lifespan.shutdown, once its stop reached it
        if self.failed:
            await send({"type": "lifespan.shutdown.failed", "message": self._message()})
        else:
            await send({"type": "lifespan.shutdown.complete"})

    async def receive(self, receive: Receive) -> Message:
        """The app's next lifespan message: the server's, or the teardown's own shutdown."""
        if not self._started or self.outcome != "pending":
            return await receive()
        if not self._request.is_set():
            incoming = await first(receive(), self._request.wait())
            if not incoming.cancelled():
                return incoming.result()
        return dict(_SHUTDOWN)

    def sent(self, message: Message) -> bool:
        """Note what the app sends; True for its answer to the teardown's own shutdown, which
        is kept for the server's (and not sent now)."""
        kind = message["type"]
        if kind == "lifespan.startup.complete":
            self._started = True
        elif kind in _ANSWERS and self._request.is_set():
            if self.outcome == "overran":
                return True  # cancelled for overrunning (Starlette then answers failed): kept
            if kind == "lifespan.shutdown.failed":
                self.outcome = "failed"
                self.detail = str(message.get("message", ""))
            else:
                self.outcome = "complete"
            self._answer.set()
            return True
        return False

    async def shut_down(self) -> bool:
        """Once the drain settled: the app's lifespan shutdown, within its bound. False when it
        failed or overran (logged); True when it completed, or there was none to run."""
        task = self._app
        if task is None or task.done() or not self._started or self._request.is_set():
            return not self.failed
        bound = max(0.0, self._bound())
        logger.info("teardown.lifespan_shutdown bound_s=%.3f", bound)
        self._request.set()
        ended = asyncio.ensure_future(asyncio.wait((task,)))
        try:
            await first(self._answer.wait(), _either(ended, self._clock.sleep(bound)))
        finally:
            ended.cancel()
        if self._answer.is_set():
            if self.outcome == "failed":
                logger.error("teardown.lifespan_failed message=%s", self.detail)
            return self.outcome == "complete"
        if task.done():  # returned without answering: nothing left to wait for
            self.outcome = "complete"
            return True
        self.outcome = "overran"
        logger.error(
            "teardown.lifespan_overran bound_s=%.3f: the app's lifespan shutdown did not finish "
            "within what was left of the drain's deadline plus the teardown margin; it is "
            "cancelled and the stop goes on",
            bound,
        )
        task.cancel("the lifespan shutdown overran its bound")
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait((task,), timeout=_CANCEL_GRACE)
        self._gave_up.set()
        return False

    def _reset(self) -> None:
        """A lifespan begins (a server may run several in one process, one after another)."""
        self._started = False
        self._request = asyncio.Event()
        self._answer = asyncio.Event()
        self._gave_up = asyncio.Event()
        self.outcome = "pending"
        self.detail = ""

    def _message(self) -> str:
        if self.outcome == "overran":
            return "the lifespan shutdown overran its bound (teardown.lifespan_overran)"
        return self.detail


async def _either(one: Awaitable[Any], other: Awaitable[Any]) -> None:
    await first(one, other)
