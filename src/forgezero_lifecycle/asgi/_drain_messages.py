"""What every drain path of the in-flight middleware sends or raises, wrapped or not (the
middleware's own responder, :mod:`._uvicorn`, :mod:`._hypercorn`)."""

from __future__ import annotations

from typing import Final

from .._errors import ConnectionClosedByDrainError

__all__ = ["ABANDONED_CODE", "CLOSE_HEADER", "LAST_CHUNK", "abandoned"]

#: The code of a send given up at the cutoff because the client did not read.
ABANDONED_CODE: Final = "RUNTIME_DRAIN_CONNECTION_ABANDONED"
#: Added to an HTTP/1 response started while draining: the connection closes after it.
CLOSE_HEADER: Final = (b"connection", b"close")
#: The empty last chunk that ends a chunked response the notice cut short.
LAST_CHUNK: Final = {"type": "http.response.body", "body": b"", "more_body": False}


def abandoned() -> ConnectionClosedByDrainError:
    """The error of a send given up at the cutoff (:data:`ABANDONED_CODE`)."""
    return ConnectionClosedByDrainError(
        ABANDONED_CODE, detail="the client did not read before the drain's deadline"
    )
