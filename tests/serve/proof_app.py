"""An app whose next generation blocks its event loop right after it begins to accept.

Configured from the environment the tests set (``serve --workers``)::

    FZP_BLOCK_FILE  read at import: when the file exists it holds seconds, and the worker
                    blocks its event loop that long right after it begins to accept on the
                    shared listener (as an app's first request, or a task started at startup,
                    may), writing ``<file>.<pid>`` with the monotonic times the block began
                    and ended

The block is hooked on the worker's ``worker.accepting`` log event (a stable event name): the
test needs the moment the worker accepts, which an app does not see. Every request is answered
with the worker's PID.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from forgezero_lifecycle.asgi._types import Receive, Scope, Send

_FILE = os.environ.get("FZP_BLOCK_FILE")
_BLOCK = float(Path(_FILE).read_text()) if _FILE and Path(_FILE).exists() else 0.0


def _block() -> None:
    began = time.monotonic()
    time.sleep(_BLOCK)
    Path(f"{_FILE}.{os.getpid()}").write_text(f"{began} {time.monotonic()}")


class _BlockAfterAccept(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("worker.accepting"):
            asyncio.get_running_loop().call_soon(_block)


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            # Hooked now: the server configures logging after the import, which drops the
            # handlers of the library's loggers.
            if _BLOCK:
                logging.getLogger("forgezero_lifecycle.serve.worker").addHandler(
                    _BlockAfterAccept()
                )
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(os.getpid()).encode()})
