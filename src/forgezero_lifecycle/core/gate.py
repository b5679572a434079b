"""The intake gate: one per runtime, the single place HTTP and WebSocket admission is decided.

``try_admit(kind)`` checks the open flag and increments the counter in one synchronous step (no
``await`` in between), so on a single event loop no unit is admitted once :meth:`close` has
returned. Waiting is event-driven: :meth:`wait_idle` wakes the moment the last admitted unit is
released, and :attr:`notice` tells long-lived connections that their stream grace is over.

The admit/release pair runs on every request, so it touches two ints and nothing else: the
future that :meth:`wait_idle` awaits exists only while somebody waits.

Three flags, three moments of a drain (DESIGN.md §3)::

    draining   readiness is off; responses carry ``Connection: close``   (drain begin)
    closed     nothing new is admitted                                   (after not-ready grace)
    notice     WebSockets get close 1012, streams get http.disconnect   (after stream grace)
"""

from __future__ import annotations

import asyncio
from typing import Literal, final

__all__ = ["GateKind", "IntakeGate"]

GateKind = Literal["http", "websocket"]


@final
class IntakeGate:
    """Admission and in-flight counting for HTTP requests and WebSocket sessions."""

    __slots__ = ("_http", "_idle_waiters", "_notice", "_open", "_websocket", "draining")

    def __init__(self) -> None:
        self._open = True
        self._http = 0
        self._websocket = 0
        #: Readiness is off and responses should move clients away (``Connection: close``).
        self.draining = False
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._notice = asyncio.Event()

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def notice(self) -> asyncio.Event:
        """Set when open streams must end (the stream grace of a drain is over)."""
        return self._notice

    def try_admit(self, kind: GateKind) -> bool:
        """Admit one unit of ``kind`` unless the gate is closed. Never awaits."""
        if not self._open:
            return False
        if kind == "http":
            self._http += 1
        else:
            self._websocket += 1
        return True

    def admit_http(self) -> bool:
        """:meth:`try_admit` for ``"http"``, without the kind test (the per-request path)."""
        if not self._open:
            return False
        self._http += 1
        return True

    def release_http(self) -> None:
        """:meth:`release` for ``"http"`` (the per-request path)."""
        self._http -= 1
        if self._idle_waiters and self._http == 0 and self._websocket == 0:
            self._wake_idle()

    def release(self, kind: GateKind) -> None:
        """Count one admitted unit of ``kind`` as finished."""
        if kind == "http":
            self._http -= 1
        else:
            self._websocket -= 1
        if self._idle_waiters and self._http == 0 and self._websocket == 0:
            self._wake_idle()

    def _wake_idle(self) -> None:
        waiters, self._idle_waiters = self._idle_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def begin_draining(self) -> None:
        """Readiness off: admission continues, responses start asking clients to reconnect."""
        self.draining = True

    def close(self) -> None:
        """Refuse every new unit from now on; admitted units run on."""
        self.draining = True
        self._open = False

    def end_streams(self) -> None:
        """Tell open WebSockets and streaming responses to end now."""
        self._notice.set()

    def reopen(self) -> None:
        """Undo a drain: admit again, stop asking clients to reconnect, withdraw the notice."""
        self._open = True
        self.draining = False
        self._notice.clear()

    async def wait_idle(self) -> None:
        """Return once no HTTP request or WebSocket session is in flight."""
        if self._http == 0 and self._websocket == 0:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle_waiters.append(waiter)
        await waiter

    def counters(self) -> dict[GateKind, int]:
        """A snapshot of in-flight units per kind."""
        return {"http": self._http, "websocket": self._websocket}
