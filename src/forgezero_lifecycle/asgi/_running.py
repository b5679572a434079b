"""The server's own requests a drain acts on, counted by the gate as admitted HTTP requests.

A request the middleware does not wrap (:mod:`._uvicorn`, :mod:`._hypercorn`) is counted from
its admission to the end of its app call. Under hypercorn its stream is a member of a set,
:attr:`RunningRequests.members`, added and discarded in place (the set's own methods: no call of
this class's on the way). Under uvicorn nothing is added: the request's drain notice names it
(:mod:`._notice`), its ``_owner`` set at admission and cleared at the end, and the notices are
registered here, weakly, once each: a connection's own at its first request
(:meth:`RunningRequests.lend`), a request's own when the connection's is taken. The running
requests are the members and the notices' owners, read only when a drain moment, a status or a
wait for idle asks, so that counting a request costs two slot stores, which its notice needs
anyway.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any, final

from ._notice import DrainNotice

__all__ = ["RunningRequests"]


@final
class RunningRequests:
    """Members added and discarded, and the owners of the notices lent here."""

    __slots__ = ("_lenders", "_own", "members")

    def __init__(self) -> None:
        #: Running requests counted by membership (hypercorn's streams), added and discarded
        #: by the middleware itself.
        self.members: set[Any] = set()
        #: Connections' notices (one per connection, as long as it lives).
        self._lenders: weakref.WeakSet[DrainNotice] = weakref.WeakSet()
        #: Notices of requests that found their connection's taken (a few at most).
        self._own: weakref.WeakSet[DrainNotice] = weakref.WeakSet()

    def lend(self, notice: DrainNotice, *, own: bool = False) -> None:
        """Count ``notice``'s owner as running whenever it has one (a connection's notice, or
        with ``own`` a request's own)."""
        (self._own if own else self._lenders).add(notice)

    def _owners(self) -> list[Any]:
        notices = [*self._lenders, *self._own]
        return [owner for owner in (notice._owner for notice in notices) if owner is not None]

    def __iter__(self) -> Iterator[Any]:
        return iter([*self.members, *self._owners()])

    def __len__(self) -> int:
        return len(self.members) + len(self._owners())

    def __bool__(self) -> bool:
        return len(self) > 0

    def __contains__(self, request: object) -> bool:
        if request in self.members:
            return True
        flow = getattr(request, "flow", None)
        flow = getattr(flow, "server_flow", flow)  # a drain's DrainFlow: the connection's below
        lent = getattr(flow, "forgezero_notice", None)
        if lent is not None and lent._owner is request:
            return True
        return any(notice._owner is request for notice in list(self._own))
