"""The CPU-bound app of ``bench.scaling``: ``/work`` spends about 1 ms of CPU, then answers.

A pure ASGI app (``serve`` wraps it in a runtime built from its flags; uvicorn serves it bare).
"""

from __future__ import annotations

import time
from typing import Any

#: The CPU each request spends.
WORK_SECONDS = 0.001
_BODY = b'{"done":true}'
_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"application/json"), (b"content-length", b"13")],
}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    until = time.process_time() + WORK_SECONDS
    while time.process_time() < until:  # busy on purpose: the CPU is the bottleneck
        pass
    await send(_START)
    await send({"type": "http.response.body", "body": _BODY})
