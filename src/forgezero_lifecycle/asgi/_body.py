"""Reading the rest of a request body that will not be used, within bounds.

A response sent while the client is still uploading, followed by a close, makes the kernel reset
the connection under the client: it sees a transport error instead of the answer (a 503 refusal,
a 401). Reading what is left first, up to a bound, lets the answer arrive and, for a server that
keeps the connection open, lets the connection be reused.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

from ._types import Receive, Scope

__all__ = ["discard_body"]

DISCARD_BYTES: Final = 4 * 1024 * 1024
DISCARD_SECONDS: Final = 1.0


async def discard_body(scope: Scope, receive: Receive) -> None:
    """Read and drop the rest of the request body; never for ``Expect: 100-continue``."""
    for name, value in scope.get("headers", ()):
        if name == b"expect" and value.lower() == b"100-continue":
            return  # the client waits for our answer before it sends the body
    seen = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(DISCARD_SECONDS):
            while seen <= DISCARD_BYTES:
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    return
                seen += len(message.get("body", b""))
