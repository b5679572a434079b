"""What blocks a drain: the oldest requests and sessions still running, named by route template.

The request path records nothing for this beyond what it keeps anyway, so a request costs no
more to serve: the middleware's set of a server's own running request objects (their age read
from what the server keeps on them), and the per-request objects of wrapped requests and
WebSocket sessions (their scope and admission instant). Everything else happens here, when a
status asks: the oldest few are picked, and each is named by what the router put in its scope
(``scope["route"]``, set by Starlette and FastAPI once a route matched: its template, such as
``/items/{item_id}``), never by the raw path, whose ids and query a status must not carry. A
request no route has matched (or an app without a router) is named by its method alone, with
``route`` null.

A server's request object tells its age as the server records it (one attribute each, relied
on here beyond their documented API and checked by tests/asgi/test_in_flight.py and
tests/cli/test_blocking.py):

* hypercorn's ``HTTPStream.start_time``: the ``time.time()`` of the request;
* uvicorn's ``RequestResponseCycle.default_headers``: the server's default headers at the
  request, whose ``date`` uvicorn renews once a second: the age to the second (a little more,
  never less). With uvicorn's date header turned off the age is unknown (``ageMs`` null).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, Final, Literal, Protocol, TypedDict

from ._types import Scope

__all__ = ["MAX_ITEMS", "InFlightItem", "oldest", "route_template"]

#: The most items a status names: enough to see what blocks a drain, few enough to stay small.
MAX_ITEMS: Final = 5
#: Longest template reported (a route's template is the app's own text, but bounded anyway).
_MAX_TEMPLATE: Final = 200

Kind = Literal["http", "websocket"]


class InFlightItem(TypedDict):
    """One running request or session, as ``detail.oldestInFlight`` lists it."""

    kind: Kind
    method: str | None
    route: str | None
    #: Milliseconds since it was admitted; None when the server keeps no trace of that.
    ageMs: int | None


class _Tracked(Protocol):
    """A wrapped request's or a session's per-request object (asgi.middleware)."""

    scope: Scope
    since: float


def route_template(scope: Mapping[str, Any] | None) -> str | None:
    """The template of the route that matched ``scope`` (``path_format`` or ``path`` of
    ``scope["route"]``), or None when no route did (or it has no template)."""
    if scope is None:
        return None
    try:
        route = scope.get("route")
        if route is None:
            return None
        template = getattr(route, "path_format", None) or getattr(route, "path", None)
    except Exception:  # an app's own route object: never fail a status for it
        return None
    if not isinstance(template, str) or not template.startswith("/"):
        return None
    return template[:_MAX_TEMPLATE]


def server_request_age(request: object, now: float) -> float | None:
    """Seconds since a server's own request object (uvicorn's cycle, hypercorn's stream) was
    created, from what the server keeps on it (the module docstring says what), or None."""
    try:
        started = getattr(request, "start_time", None)
        if isinstance(started, float):
            return now - started
        for name, value in getattr(request, "default_headers", ()):
            if name == b"date":
                return now - parsedate_to_datetime(value.decode("latin-1")).timestamp()
    except Exception:  # a server that changed under us: the age is unknown, nothing fails
        return None
    return None


def _item(kind: Kind, scope: object, age: float | None) -> InFlightItem:
    mapping = scope if isinstance(scope, Mapping) else None
    method = mapping.get("method") if mapping is not None else None
    return {
        "kind": kind,
        "method": method if isinstance(method, str) and method.isalpha() else None,
        "route": route_template(mapping),
        "ageMs": None if age is None else max(0, round(age * 1000)),
    }


def oldest(
    running: Iterable[object],
    wrapped: Iterable[_Tracked],
    sessions: Iterable[_Tracked],
    limit: int = MAX_ITEMS,
) -> list[InFlightItem]:
    """The ``limit`` oldest of a middleware's running requests and sessions, oldest first
    (those of unknown age after every one whose age is known)."""
    wall, monotonic = time.time(), time.monotonic()
    candidates: list[tuple[float, int, Kind, object, float | None]] = []
    for request in running:
        age = server_request_age(request, wall)
        scope = getattr(request, "scope", None)
        candidates.append(
            (-(age if age is not None else -1.0), len(candidates), "http", scope, age)
        )
    for responder in wrapped:
        age = monotonic - responder.since
        candidates.append((-age, len(candidates), "http", responder.scope, age))
    for session in sessions:
        age = monotonic - session.since
        candidates.append((-age, len(candidates), "websocket", session.scope, age))
    picked = heapq.nsmallest(limit, candidates)
    return [_item(kind, scope, age) for _, _, kind, scope, age in picked]
