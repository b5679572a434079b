"""The app of the WebSocket cutoff tests: a push-only route and a runtime whose signal hook is on.

Run as the user would (uvicorn, hypercorn) or under ``forgezero-lifecycle serve``. Environment::

    FORGEZERO_CONTROL_TOKEN          control token (required)
    FORGEZERO_STREAM_GRACE           seconds before open WebSockets get close 1012
    FORGEZERO_SIGNAL_DRAIN_TIMEOUT   the runtime's signal_drain_timeout, in seconds
    FORGEZERO_NOTICE_SPREAD          the runtime's stream_notice_spread, in seconds (0 unless set)

``/push`` sends 64 KiB binary messages as fast as the connection takes them and never calls
``receive()``: a client that does not read fills every buffer and blocks the send (the app then
prints ``push.blocked`` on stderr, once per connection). ``/ticks``
sends a short text message every ``interval`` seconds (query parameter, default 0.02) and never
calls ``receive()`` either. The library's loggers go to stderr.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from forgezero_lifecycle.runtime import Runtime

_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
_library = logging.getLogger("forgezero_lifecycle")
_library.addHandler(_handler)
_library.setLevel(logging.INFO)
_library.propagate = False

_CHUNK = b"x" * 65536

runtime = Runtime(
    control_token=os.environ["FORGEZERO_CONTROL_TOKEN"],
    stream_grace=float(os.environ.get("FORGEZERO_STREAM_GRACE", "1")),
    signal_drain_timeout=float(os.environ.get("FORGEZERO_SIGNAL_DRAIN_TIMEOUT", "5")),
    stream_notice_spread=float(os.environ.get("FORGEZERO_NOTICE_SPREAD", "0")),
)


#: A send of ``/push`` still pending after this long, while the loop ran, waits on a full buffer.
_BLOCKED_AFTER = 0.3


async def push(websocket: WebSocket) -> None:
    """Sends until a send blocks (said once on stderr: ``push.blocked``), and on."""
    await websocket.accept()
    loop = asyncio.get_running_loop()
    sent_at = loop.time()

    async def tell_when_blocked() -> None:
        # This task runs on the same loop: a send pending this long while it ran is not waiting
        # for the CPU, but for the client to read.
        while loop.time() - sent_at < _BLOCKED_AFTER:  # noqa: ASYNC110 - no event says a send is blocked
            await asyncio.sleep(0.05)
        print("push.blocked", file=sys.stderr, flush=True)

    watch = asyncio.create_task(tell_when_blocked())
    try:
        while True:
            await websocket.send_bytes(_CHUNK)
            sent_at = loop.time()
            await asyncio.sleep(0)
    finally:
        watch.cancel()


async def ticks(websocket: WebSocket) -> None:
    interval = float(websocket.query_params.get("interval", "0.02"))
    await websocket.accept()
    while True:
        await websocket.send_text("tick")
        await asyncio.sleep(interval)


app = Starlette(routes=[WebSocketRoute("/push", push), WebSocketRoute("/ticks", ticks)])
runtime.install(app)
