"""A raw ASGI app for the requests a drain finds already running (test_in_flight_at_drain.py).

Each path holds its request in one place the drain must reach: ``/respond-later`` reads its
body, then works past the stream grace and answers; ``/receive-later`` starts a chunked
response, works past the grace without waiting on ``receive()``, then waits on it;
``/started`` sends its head and first chunk at once and its last chunk after ``seconds``.
What that ``receive()`` returned is listed at ``/_test/seen``.
Every response names, in ``x-send-owner``, the class behind the ``send`` the app was handed.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from forgezero_lifecycle.asgi._types import Receive, Scope, Send
from forgezero_lifecycle.runtime import Runtime

runtime = Runtime(
    control_token=os.environ["FORGEZERO_CONTROL_TOKEN"],
    revision=os.environ.get("FORGEZERO_REVISION"),
    stream_grace=float(os.environ.get("FORGEZERO_STREAM_GRACE", "0.5")),
    exempt=lambda scope: scope["path"].startswith("/_test/"),
)


#: What ``receive()`` returned to ``/receive-later`` after its pause, per request, in order.
seen: list[str] = []


def _query(scope: Scope) -> dict[str, str]:
    pairs = (part.split("=", 1) for part in scope["query_string"].decode().split("&") if part)
    return dict(pairs)


def _head(send: Send, **more: str) -> dict[str, Any]:
    owner = type(getattr(send, "__self__", None)).__name__
    headers = [(b"x-send-owner", owner.encode())]
    headers += [(name.encode(), value.encode()) for name, value in more.items()]
    return {"type": "http.response.start", "status": 200, "headers": headers}


async def _read_body(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return body


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    path, seconds = scope["path"], float(_query(scope).get("seconds", "0"))
    if path.startswith("/_test/"):
        found = runtime.in_flight().model_dump() if path == "/_test/counters" else seen
        body = json.dumps(found).encode()
        await send(_head(send, **{"content-length": str(len(body))}))
        await send({"type": "http.response.body", "body": body})
    elif path == "/respond-later":
        body = await _read_body(receive)
        await asyncio.sleep(seconds)
        await send(_head(send, **{"content-length": str(len(body))}))
        await send({"type": "http.response.body", "body": body})
    elif path == "/receive-later":
        await _read_body(receive)
        await send(_head(send))
        await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
        await asyncio.sleep(seconds)
        message = await receive()
        seen.append(message["type"])
        await send({"type": "http.response.body", "body": message["type"].encode() + b"\n"})
    elif path == "/started":
        await _read_body(receive)
        await send(_head(send))
        await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
        await asyncio.sleep(seconds)
        await send({"type": "http.response.body", "body": b"last\n"})


app = runtime.wrap(app)
