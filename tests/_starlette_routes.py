"""Whether the installed Starlette tells a request its matched route (``scope["route"]``), which
the route templates of a drain's status (``detail.oldestInFlight``) are read from; older
releases (such as make test-oldest's) do not, and the status names no template there."""

from __future__ import annotations

import asyncio
from typing import Final

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["ROUTE_IN_SCOPE", "needs_route_in_scope"]


def _sets_route() -> bool:
    seen: list[object] = []

    async def endpoint(request: Request) -> Response:
        seen.append(request.scope.get("route"))
        return Response()

    async def call() -> None:
        async def receive() -> dict[str, object]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, object]) -> None:
            pass

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
            "scheme": "http", "path": "/probe", "raw_path": b"/probe", "root_path": "",
            "query_string": b"", "headers": [], "client": None, "server": None,
        }  # fmt: skip
        await Starlette(routes=[Route("/probe", endpoint)])(scope, receive, send)

    asyncio.run(call())
    return bool(seen) and seen[0] is not None


ROUTE_IN_SCOPE: Final = _sets_route()


def needs_route_in_scope() -> object:
    """A skip mark for a test of route templates under a Starlette that sets no route."""
    import pytest

    return pytest.mark.skipif(
        not ROUTE_IN_SCOPE,
        reason="this Starlette does not set scope['route']: the status names no route template",
    )
