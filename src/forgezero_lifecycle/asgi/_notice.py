"""The drain notice a handler can reach: ``scope["extensions"]["forgezero.drain"]``.

Every HTTP and WebSocket scope the in-flight middleware admits carries a :class:`DrainNotice`
(docs/long-lived-work.md). ``await notice.wait()`` returns at this request's instant of the
stream notice: after the not-ready grace and the stream grace, at its own place in the notice's
spread (``Runtime(stream_notice_spread=...)``), or at the cutoff if that comes first.
``notice.deadline`` is how many seconds are left until the cutoff while a drain runs (None while
serving).

A request whose handler waits on the notice is told through it alone: the middleware does not
end it at its instant (no ``http.disconnect`` on ``receive()``, no close 1012), so the handler
can send a last event and return by itself. What it has not ended by the cutoff is ended then,
as every other request is.

What one request pays for it is this object (one slot, made without an ``__init__`` call:
:meth:`NoticeBoard.notice`) and, under a server whose scope has no ``extensions``, one small
dict: nothing is looked at until the handler reads it. Under uvicorn while serving, the notice
is the connection's, made at its first request and lent to each of its requests in turn (a
request that starts while the last one still runs gets its own): a request pays two slot stores
and the dict (its own, so that what an app puts in its extensions stays its own). The place in
the spread is taken when ``wait()`` is first called (:meth:`NoticeBoard.listen`). When the
request ends the notice lets go of it: the request's object holds the scope and the scope the
notice, so a notice that kept its request would leave every request's objects for the cyclic
collector to free. A notice kept past its request still answers (``deadline`` and ``draining`` as before); its ``wait()`` speaks for the request it is
lent to then, if any, else returns at the stream notice.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any, Final, final

from .._race import first
from ..core.gate import IntakeGate

__all__ = ["EXTENSION", "DrainNotice", "Listener", "NoticeBoard"]

_new = object.__new__

#: The key of the notice in ``scope["extensions"]``.
EXTENSION: Final = "forgezero.drain"


class Listener:
    """What the middleware keeps per wrapped request or WebSocket session for the notice: its
    delay in the spread, and whether its handler waits on the notice (set by the first
    ``wait()``). Subclasses set both in their ``__init__``."""

    __slots__ = ("listening", "notice_delay")

    #: Seconds after the notice this request is told (its instant in the spread).
    notice_delay: float
    #: Its handler waits on the drain notice: the drain ends it at the cutoff only.
    listening: bool


@final
class NoticeBoard:
    """One per middleware: what every request's :class:`DrainNotice` reads, and which of the
    server's own requests (uvicorn cycles, hypercorn streams) have a handler waiting on it."""

    __slots__ = ("_room", "gate", "kind", "listening")

    def __init__(self, gate: IntakeGate, room: Callable[[], float] | None) -> None:
        self.gate = gate
        self._room = room
        #: The server's request objects whose handler waits on the notice, with their delay in
        #: the spread (set at the notice). Weak: an entry goes with its request.
        self.listening: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        #: This board's notices: a DrainNotice with the board a class attribute, so a request's
        #: notice is one slot to fill (see :meth:`notice`).
        self.kind: type[DrainNotice] = type(
            "DrainNotice", (DrainNotice,), {"__slots__": (), "_board": self}
        )

    def notice(self, owner: object) -> DrainNotice:
        """A notice for ``owner`` (the request's own object). The middleware's hot paths do
        the same inline: ``_new(board.kind)`` and one slot set, no ``__init__`` call."""
        notice = _new(self.kind)
        notice._owner = owner
        return notice

    def listen(self, owner: Any) -> None:
        """``owner``'s handler waits on the notice: the middleware does not end it at its
        instant, only at the cutoff."""
        if isinstance(owner, Listener):  # the middleware's own responder or session
            owner.listening = True
        elif owner not in self.listening:
            self.listening[owner] = 0.0

    def delay(self, owner: Any) -> float:
        """Seconds after the notice ``owner`` is told (its place in the spread)."""
        if isinstance(owner, Listener):
            return owner.notice_delay
        return self.listening.get(owner, 0.0)

    def deadline(self) -> float | None:
        if not self.gate.draining or self._room is None:
            return None
        if self.gate.cutoff.is_set():
            return 0.0
        return max(0.0, self._room())


class DrainNotice:
    """``scope["extensions"]["forgezero.drain"]``: when this request should end, and how long
    is left until the drain cuts it."""

    __slots__ = ("__weakref__", "_owner")

    #: Set on each board's subclass (:attr:`NoticeBoard.kind`).
    _board: NoticeBoard
    #: The request's own object: a server's request cycle or stream, or the middleware's
    #: wrapped request or WebSocket session; None once the request has ended (the owner holds
    #: the scope, which holds this notice: a reference cycle, else, for the collector to free).
    _owner: object

    async def wait(self) -> None:
        """Return at this request's instant of the stream notice (or at the cutoff, if that
        comes first); at once when it has passed. Safe to call from any task, many times."""
        board = self._board
        gate = board.gate
        owner = self._owner
        if owner is None:  # its request has ended: nothing left to end, no place in the spread
            await gate.notice.wait()
            return
        board.listen(owner)
        await gate.notice.wait()
        delay = board.delay(owner)
        if delay > 0 and not gate.cutoff.is_set():
            await first(asyncio.sleep(delay), gate.cutoff.wait())

    @property
    def draining(self) -> bool:
        """True from the instant a drain begins (readiness off) until a rollback."""
        return self._board.gate.draining

    @property
    def deadline(self) -> float | None:
        """Seconds left until the drain's cutoff, when a send still running is given up and
        the connection abandoned; 0 once it has come; None while no drain runs (or when the
        middleware runs without a runtime, which alone knows the deadline)."""
        return self._board.deadline()
