"""The intake gate: one per runtime, the single place HTTP and WebSocket admission is decided.

``try_admit(kind)`` checks the open flag and increments the counter in one synchronous step (no
``await`` in between), so on a single event loop no unit is admitted once :meth:`close` has
returned. Waiting is event-driven: :meth:`wait_idle` wakes the moment the last admitted unit is
released, :attr:`notice` tells long-lived connections that their stream grace is over, and
:attr:`cutoff` tells sends still blocked by a client that does not read that the drain gives up
on them.

The admit/release pair runs on every request, so it touches two ints and nothing else: the
future that :meth:`wait_idle` awaits exists only while somebody waits. A middleware that serves
requests unwrapped counts them cheaper still, as members of a set of its own
(:meth:`running_set`), or of a collection it keeps otherwise (:meth:`count_running`): adding one
while :attr:`serving` is admission, discarding it is release.

Four flags, four moments of a drain (the runtime module's docstring lists its steps)::

    draining   readiness is off; responses carry ``Connection: close``   (drain begin)
    closed     nothing new is admitted; HTTP/2 gets its final GOAWAY     (after not-ready grace)
    notice     WebSockets get close 1012, streams get http.disconnect   (after stream grace)
    cutoff     sends still blocked are given up, their connections too  (at the release margin)

:meth:`watch` hands each of these moments to a callback, synchronously, inside the call that
begins it: a request admitted before the drain and not yet wrapped for it can be
acted on before anything else runs (the middleware's uvicorn path, the ``serve`` server).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sized
from dataclasses import dataclass
from typing import Literal, final

__all__ = ["DrainMoment", "GateKind", "GateStatistics", "IntakeGate"]

GateKind = Literal["http", "websocket"]
#: The moments :meth:`IntakeGate.watch` reports, in the order a drain reaches them.
DrainMoment = Literal["draining", "closed", "notice", "cutoff"]


@final
@dataclass(frozen=True, slots=True)
class GateStatistics:
    """A snapshot of the gate: units in flight per kind, and the totals the middleware counts."""

    http: int
    websocket: int
    refused_http: int
    refused_websocket: int
    closed_at_grace: int
    #: Units still in flight when a drain's cutoff came, per kind, over every drain: their sends
    #: still blocked then were given up and their connections abandoned.
    cut_off_http: int = 0
    cut_off_websocket: int = 0


@final
class IntakeGate:
    """Admission and in-flight counting for HTTP requests and WebSocket sessions."""

    __slots__ = (
        "_cutoff",
        "_draining_event",
        "_http",
        "_idle_waiters",
        "_notice",
        "_open",
        "_running_sets",
        "_watchers",
        "_websocket",
        "closed_at_grace",
        "cut_off_http",
        "cut_off_websocket",
        "draining",
        "refused_http",
        "refused_websocket",
        "serving",
        "waiting_idle",
    )

    def __init__(self) -> None:
        self._open = True
        self._http = 0
        self._websocket = 0
        #: Readiness is off and responses should move clients away (``Connection: close``). The
        #: plain bool the request path reads; :attr:`draining_event` is set and cleared with it.
        self.draining = False
        #: Open and not draining: a request admitted now needs nothing done to it until a drain
        #: moment comes (the test before adding to a :meth:`running_set`).
        self.serving = True
        #: The sets of :meth:`running_set`, whose members count as admitted HTTP requests.
        self._running_sets: list[Sized] = []
        self._draining_event = asyncio.Event()
        self._idle_waiters: list[asyncio.Future[None]] = []
        #: Somebody waits in :meth:`wait_idle` (the test after discarding from a running set).
        self.waiting_idle = False
        self._notice = asyncio.Event()
        self._cutoff = asyncio.Event()
        self._watchers: list[Callable[[DrainMoment], None]] = []
        #: Totals counted by the middleware (only on refusal and at the notice), read through
        #: :meth:`statistics`.
        self.refused_http = 0
        self.refused_websocket = 0
        self.closed_at_grace = 0
        self.cut_off_http = 0
        self.cut_off_websocket = 0

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def draining_event(self) -> asyncio.Event:
        """Set while :attr:`draining` is true, for code that waits for a drain to begin."""
        return self._draining_event

    @property
    def notice(self) -> asyncio.Event:
        """Set when open streams must end (the stream grace of a drain is over)."""
        return self._notice

    @property
    def cutoff(self) -> asyncio.Event:
        """Set when a send still blocked by a client that does not read must be given up."""
        return self._cutoff

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
        if self._idle_waiters and self._idle():
            self._wake_idle()

    def release(self, kind: GateKind) -> None:
        """Count one admitted unit of ``kind`` as finished."""
        if kind == "http":
            self._http -= 1
        else:
            self._websocket -= 1
        if self._idle_waiters and self._idle():
            self._wake_idle()

    def running_set(self) -> set[object]:
        """A new set whose members count as admitted HTTP requests, for a middleware's requests
        that the drain acts on from outside (the server's own request objects, unwrapped).

        Its owner keeps two rules: a member is added only while :attr:`serving` is true, in the
        same synchronous step as that test (so nothing is admitted once a drain has begun, and a
        drain moment finds every member in the set); once one is discarded, the owner calls
        :meth:`released` if :attr:`waiting_idle`. What a request costs to count is then a set
        add, a set discard and two attribute reads.
        """
        members: set[object] = set()
        self.count_running(members)
        return members

    def count_running(self, members: Sized) -> None:
        """Count the members of ``members`` as admitted HTTP requests, as those of a
        :meth:`running_set` (same rules), for an owner that keeps them otherwise: its ``len``
        is read only at a status, a drain's cutoff and while somebody waits in
        :meth:`wait_idle`."""
        self._running_sets.append(members)

    def released(self) -> None:
        """A member of a :meth:`running_set` was discarded while :attr:`waiting_idle`: wake
        :meth:`wait_idle` if nothing is left in flight."""
        if self._idle_waiters and self._idle():
            self._wake_idle()

    def _in_flight_http(self) -> int:
        return self._http + sum(map(len, self._running_sets))

    def _idle(self) -> bool:
        return self._websocket == 0 and self._in_flight_http() == 0

    def _wake_idle(self) -> None:
        waiters, self._idle_waiters = self._idle_waiters, []
        self.waiting_idle = False
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def watch(self, watcher: Callable[[DrainMoment], None]) -> None:
        """Call ``watcher`` at each drain moment, synchronously, before the call that begins it
        returns: ``"draining"`` once per drain (by :meth:`begin_draining` or :meth:`close`),
        ``"closed"`` once per drain (the first :meth:`close`), ``"notice"`` at
        :meth:`end_streams`, ``"cutoff"`` at :meth:`cut_off`."""
        self._watchers.append(watcher)

    def _tell(self, moment: DrainMoment) -> None:
        for watcher in self._watchers:
            watcher(moment)

    def begin_draining(self) -> None:
        """Readiness off: admission continues, responses start asking clients to reconnect."""
        if not self.draining:
            self.draining = True
            self.serving = False
            self._draining_event.set()
            self._tell("draining")

    def close(self) -> None:
        """Refuse every new unit from now on; admitted units run on."""
        self.begin_draining()
        if self._open:
            self._open = False
            self._tell("closed")

    def end_streams(self) -> None:
        """Tell open WebSockets and streaming responses to end now."""
        self._notice.set()
        self._tell("notice")

    def cut_off(self) -> None:
        """Give up on sends still blocked in the server's flow control (implies the notice)."""
        self.cut_off_http += self._in_flight_http()
        self.cut_off_websocket += self._websocket
        self._notice.set()
        self._cutoff.set()
        self._tell("cutoff")

    def reopen(self) -> None:
        """Undo a drain: admit again, stop asking clients to reconnect, withdraw notice and cutoff."""
        self._open = True
        self.draining = False
        self.serving = True
        self._draining_event.clear()
        self._notice.clear()
        self._cutoff.clear()

    async def wait_idle(self) -> None:
        """Return once no HTTP request or WebSocket session is in flight.

        A wait given up (cancelled) is forgotten at once: :attr:`waiting_idle` turns false when
        nobody else waits, so a running set's owner stops calling :meth:`released`.
        """
        if self._idle():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle_waiters.append(waiter)
        self.waiting_idle = True
        try:
            await waiter
        finally:
            if not waiter.done() or waiter.cancelled():  # given up: take this waiter away
                waiters = self._idle_waiters
                if waiter in waiters:
                    waiters.remove(waiter)
                self.waiting_idle = bool(waiters)

    def statistics(self) -> GateStatistics:
        """A frozen copy of the in-flight counts and the refusal and notice totals."""
        return GateStatistics(
            http=self._in_flight_http(),
            websocket=self._websocket,
            refused_http=self.refused_http,
            refused_websocket=self.refused_websocket,
            closed_at_grace=self.closed_at_grace,
            cut_off_http=self.cut_off_http,
            cut_off_websocket=self.cut_off_websocket,
        )
