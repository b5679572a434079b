"""An app whose import takes a while, with a lifespan that leaves markers (``serve --workers``).

Configured from the environment the tests set::

    FZB_MARKERS         directory; each worker writes ``<pid>.importing`` as its import begins,
                        and appends ``startup`` and ``shutdown`` to ``<pid>.lifespan`` as its
                        lifespan runs them
    FZB_IMPORT_SECONDS  how long the import takes at most (seconds): it ends earlier once the
                        file ``release`` exists in FZB_MARKERS
    FZB_SHUTDOWN_SECONDS  how long its lifespan shutdown takes (seconds)
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from forgezero_lifecycle.asgi._types import Receive, Scope, Send

_MARKERS = Path(os.environ["FZB_MARKERS"])
(_MARKERS / f"{os.getpid()}.importing").touch()
_importing_until = time.monotonic() + float(os.environ.get("FZB_IMPORT_SECONDS", "0"))
# The import ends when the test says (``release`` in the markers), or after FZB_IMPORT_SECONDS.
while time.monotonic() < _importing_until and not (_MARKERS / "release").exists():
    time.sleep(0.02)


def _mark(what: str) -> None:
    with (_MARKERS / f"{os.getpid()}.lifespan").open("a") as markers:
        markers.write(what + "\n")


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                _mark("startup")
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await asyncio.sleep(float(os.environ.get("FZB_SHUTDOWN_SECONDS", "0")))
                _mark("shutdown")
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(os.getpid()).encode()})
