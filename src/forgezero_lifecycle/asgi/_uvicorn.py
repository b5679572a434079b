"""The in-flight middleware under uvicorn: nothing wrapped while serving; a drain acts on the
server's own request cycles instead.

While no drain has begun, a request uvicorn serves (its ``send`` is the bound ``send`` of a
``RequestResponseCycle``, h11 or httptools) reaches the app with the server's own ``receive``
and ``send``; the middleware counts it and keeps its cycle in a set of running requests, which
is all a request costs. Each drain moment then acts on the cycles in that set, synchronously
(:meth:`~forgezero_lifecycle.core.gate.IntakeGate.watch`), so a request admitted one instruction
before the drain begins is acted on before it can run again:

* draining: a response not started yet gets ``connection: close`` among the cycle's default
  headers and ``keep_alive = False`` (uvicorn closes the connection after it), as a wrapped
  response would. One that started before keeps its connection, as under any server: closing
  it after the response, without a header that says so, races a client that sends its next
  request on it (``forgezero-lifecycle serve`` does close those: its stop answers such a race);
* notice: the cycle's flow control is seen through :class:`DrainFlow`, which every ``receive()``
  passes through: one after the body (waiting at the notice, or made later) returns
  ``http.disconnect`` as if the client had left. uvicorn then drops what the app sends, as for
  a client that left, until the app returns; the middleware then puts the connection back, or
  aborts it when the response was left unfinished, so the client sees the body incomplete
  (docs/long-lived-work.md, "A cut that can be seen");
* cutoff: a send blocked in flow control is released, and from then on a send that would block
  raises :class:`~forgezero_lifecycle.ConnectionClosedByDrainError`; the connection is aborted once
  the app returns.

What this relies on of uvicorn (the cycle's attributes, and that ``receive()`` calls
``flow.resume_reading()`` before it waits) and of asyncio (an event's waiters) is listed in
:mod:`forgezero_lifecycle._internals.uvicorn` and :mod:`forgezero_lifecycle._internals.asyncio`.
Any other server's requests, and those of a uvicorn without it, are wrapped instead
(:class:`~forgezero_lifecycle.asgi.middleware.InFlightMiddleware`).
"""

from __future__ import annotations

import asyncio
import logging
from types import FrameType
from typing import Any, Final, final

from .._internals import asyncio as _asyncio
from .._internals import report
from .._internals.uvicorn import (
    CYCLE_ATTRIBUTES,
    CYCLE_MODULES,
    MIDDLEWARE_MODULES,
    WEBSOCKET_MODULES,
)
from ..core.gate import DrainMoment
from ._drain_messages import CLOSE_HEADER, abandoned

__all__ = [
    "KNOWN_CYCLES",
    "DrainFlow",
    "act",
    "call_directly",
    "cut",
    "cut_response",
    "given_up",
    "learn",
    "reconnect",
    "settle",
]

logger = logging.getLogger("forgezero_lifecycle.middleware")

#: Per class of ``send.__self__``: whether it is a uvicorn cycle this path knows, filled by
#: :func:`learn` once per class (a middleware remembers the last class itself).
KNOWN_CYCLES: Final[dict[type, bool]] = {}


def learn(cycle: object) -> bool:
    """Whether ``cycle`` (a ``send.__self__``) is a uvicorn ``RequestResponseCycle`` with all
    this path uses (:data:`~forgezero_lifecycle._internals.uvicorn.CYCLE_ATTRIBUTES`);
    remembered per class in KNOWN_CYCLES. A uvicorn cycle without them is reported once."""
    kind = type(cycle)
    uvicorn_cycle = kind.__name__ == "RequestResponseCycle" and kind.__module__ in CYCLE_MODULES
    known = (
        uvicorn_cycle
        and all(hasattr(cycle, name) for name in CYCLE_ATTRIBUTES)
        # Telling whether the app waits in receive() reads the event's waiters (CPython's).
        and "Event._waiters" not in _asyncio.missing()
    )
    if uvicorn_cycle and not known:
        report(("uvicorn", "asyncio"))
    KNOWN_CYCLES[kind] = known
    return known


def call_directly(caller: FrameType | None, middleware: object) -> None:
    """Hand uvicorn's own middleware (``ProxyHeadersMiddleware``, on by default, and
    ``MessageLoggerMiddleware``), when ``caller`` is its frame calling ``middleware``, the
    bound ``__call__`` of ``middleware`` in place of the instance: calling an instance looks up
    its ``__call__`` and builds an argument tuple on every request, a bound method is called the
    way a function is (about 700 instructions a request, callgrind). Done once, at the first call
    (the lifespan's, or the first request's without one)."""
    if caller is None:
        return
    outer: Any = caller.f_locals.get("self")
    if type(outer).__module__ in MIDDLEWARE_MODULES and getattr(outer, "app", None) is middleware:
        outer.app = middleware.__call__  # type: ignore[operator]  # an ASGI app's own


def act(moment: DrainMoment, cycle: Any) -> None:
    """Apply one drain moment to the cycle of a request admitted before the drain."""
    if cycle.response_complete:
        return
    if moment == "draining":
        if not cycle.response_started:  # one that started already keeps its connection
            cycle.keep_alive = False
            cycle.default_headers = [*cycle.default_headers, CLOSE_HEADER]
        return
    flow = cycle.flow
    if type(flow) is not DrainFlow:
        flow = cycle.flow = DrainFlow(cycle, flow)
        event = cycle.message_event
        if not cycle.more_body and not event.is_set() and _asyncio.has_waiters(event):
            flow.tell_disconnect()  # the app waits in receive() after its body: wake it now
    if moment == "cutoff":
        flow.cut = True
        if flow.server_flow.write_paused:
            flow.abandon()


def cut(cycle: Any) -> None:
    """A forced stop: abort the connection of a cycle whose response is not complete."""
    if not cycle.response_complete:
        _drop(cycle)


def given_up(cycle: Any) -> bool:
    """Whether the cutoff gave up on this cycle's connection; if so, abandon it now."""
    flow = cycle.flow
    if type(flow) is DrainFlow and flow.abandoned:
        _drop(cycle)
        return True
    return False


def reconnect(cycle: Any) -> bool:
    """Undo the disconnect the notice told the app of, unless the client has really left;
    True when it was undone (uvicorn writes to the connection again)."""
    flow = cycle.flow
    if type(flow) is not DrainFlow or not flow.disconnected or cycle.transport.is_closing():
        return False
    flow.disconnected = False
    cycle.disconnected = False
    return True


def settle(cycle: Any) -> None:
    """After the app returned during a drain: a response the notice cut short (told
    ``http.disconnect``, returned before its last part) has its connection aborted, so the
    client sees the body incomplete (no last chunk, or fewer bytes than its length says)."""
    if given_up(cycle):
        return  # abandoned at the cutoff: aborted already
    flow = cycle.flow
    if (
        type(flow) is DrainFlow
        and flow.disconnected
        and cycle.response_started
        and not cycle.response_complete
    ):
        logger.warning("drain.response_cut kind=http")
        _drop(cycle)
        return
    reconnect(cycle)  # told, and ended anyway (or never started): uvicorn's handling stands


def cut_response(send: object) -> bool:
    """End the response whose ``send`` this is so the client sees it incomplete: its
    connection aborted (HTTP/1) or its stream reset (hypercorn's HTTP/2). False under a server
    the middleware does not know."""
    owner = getattr(send, "__self__", None)
    kind = type(owner)
    known = KNOWN_CYCLES.get(kind)
    if known is None:
        known = learn(owner)
    if known:
        logger.warning("drain.response_cut kind=http")
        _drop(owner)
        return True
    from . import _hypercorn  # the two servers' paths, side by side

    return _hypercorn.cut_response(owner)


def _drop(cycle: Any) -> None:
    """Abandon the connection, quietly: uvicorn sees a client that left."""
    cycle.disconnected = True
    cycle.transport.abort()


@final
class DrainFlow:
    """uvicorn's flow control of one running cycle, as the drain's notice and cutoff see it."""

    __slots__ = ("_cycle", "abandoned", "cut", "disconnected", "server_flow")

    def __init__(self, cycle: Any, server_flow: Any) -> None:
        self._cycle = cycle
        self.server_flow = server_flow
        #: The notice told the app its client left (uvicorn's ``disconnected`` is set for it).
        self.disconnected = False
        #: The cutoff has come: a send that would block is given up.
        self.cut = False
        #: A send was blocked at the cutoff, or would have blocked after it.
        self.abandoned = False

    @property
    def write_paused(self) -> bool:
        return self.abandoned or bool(self.server_flow.write_paused)

    @property
    def read_paused(self) -> bool:
        return bool(self.server_flow.read_paused)

    async def drain(self) -> None:
        if self.cut:
            self.abandon()
        if self.abandoned:
            raise abandoned()
        await self.server_flow.drain()

    def pause_reading(self) -> None:
        self.server_flow.pause_reading()

    def resume_reading(self) -> None:
        # receive() calls this before it waits: after the body, that wait is for a disconnect.
        self.server_flow.resume_reading()
        cycle = self._cycle
        if not cycle.more_body and not cycle.message_event.is_set():
            self.tell_disconnect()

    def pause_writing(self) -> None:
        self.server_flow.pause_writing()

    def resume_writing(self) -> None:
        self.server_flow.resume_writing()

    def tell_disconnect(self) -> None:
        self.disconnected = True
        cycle = self._cycle
        cycle.disconnected = True
        cycle.message_event.set()

    def abandon(self) -> None:
        if self.abandoned:
            return
        self.abandoned = True
        logger.warning("drain.connection_abandoned kind=http")
        self.server_flow.resume_writing()  # a send blocked now returns; the next one raises


def websocket_transport(send: object) -> asyncio.Transport | None:
    """The connection of a uvicorn WebSocket session whose ``send`` this is, or None when it
    is not one (or a uvicorn without the protocol's ``transport``)."""
    protocol = getattr(send, "__self__", None)
    if type(protocol).__module__ not in WEBSOCKET_MODULES:
        return None
    transport = getattr(protocol, "transport", None)
    # uvloop's transports are no asyncio.BaseTransport: what is used of them is asked for.
    if not callable(getattr(transport, "abort", None)):
        return None
    return transport
