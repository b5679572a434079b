"""Opt-in read-only documents in front of the control plane: the OpenAPI document, metrics.

Each path answers ``GET`` (and ``HEAD``) with the bytes its callable returns at request time,
without a token: what they publish is the same for every deployment (the OpenAPI document) or
holds counters and no secret (metrics), and a scraper or schema browser rarely carries a bearer
token. Every other path goes on to the control plane unchanged. Nothing is served unless the
runtime was asked to (``Runtime(openapi=True)``, ``Runtime(metrics=...)``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import final

import orjson

from ._body import discard_body
from ._paths import app_path
from ._types import ASGIApp, Receive, Scope, Send

__all__ = ["Document", "PublishedDocuments"]

#: A published document: ``() -> (body, content type)``, called for each request.
Document = Callable[[], tuple[bytes, str]]


@final
class PublishedDocuments:
    """Serve ``documents`` (path -> callable) and pass every other request to ``control``."""

    def __init__(self, control: ASGIApp, documents: Mapping[str, Document]) -> None:
        self._control = control
        self._documents = dict(documents)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._control(scope, receive, send)
            return
        document = self._documents.get(app_path(scope))
        if document is None:
            await self._control(scope, receive, send)
            return
        await discard_body(scope, receive)
        if scope["method"] not in ("GET", "HEAD"):
            body = orjson.dumps(
                {"error": "RUNTIME_METHOD_NOT_ALLOWED", "detail": "use GET or HEAD"}
            )
            headers = [(b"allow", b"GET, HEAD")]
            await _respond(send, 405, body, "application/json", headers)
            return
        content, content_type = document()
        await _respond(send, 200, content, content_type, [], head=scope["method"] == "HEAD")


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    content_type: str,
    headers: list[tuple[bytes, bytes]],
    *,
    head: bool = False,
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": b"" if head else body})
