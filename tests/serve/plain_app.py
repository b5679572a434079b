"""A plain ASGI app without a runtime of its own: ``serve`` wraps it in one built from its flags."""

from __future__ import annotations

from forgezero_lifecycle.asgi._types import Receive, Scope, Send


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"plain"})
