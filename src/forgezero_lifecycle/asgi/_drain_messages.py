"""What every drain path of the in-flight middleware sends or raises, wrapped or not (the
middleware's own responder, :mod:`._uvicorn`, :mod:`._hypercorn`)."""

from __future__ import annotations

from typing import Final

from .._errors import ConnectionClosedByDrainError

__all__ = ["ABANDONED_CODE", "CLOSE_HEADER", "CUT_CODE", "abandoned", "response_cut"]

#: The code of a send given up at the cutoff because the client did not read.
ABANDONED_CODE: Final = "RUNTIME_DRAIN_CONNECTION_ABANDONED"
#: Added to an HTTP/1 response started while draining: the connection closes after it.
CLOSE_HEADER: Final = (b"connection", b"close")
#: The code of a response the drain ended before its last part: its connection is aborted
#: (HTTP/1) or its stream reset (HTTP/2), so the client sees the body is incomplete.
CUT_CODE: Final = "RUNTIME_DRAIN_RESPONSE_CUT"


def abandoned() -> ConnectionClosedByDrainError:
    """The error of a send given up at the cutoff (:data:`ABANDONED_CODE`)."""
    return ConnectionClosedByDrainError(
        ABANDONED_CODE, detail="the client did not read before the drain's deadline"
    )


def response_cut() -> ConnectionClosedByDrainError:
    """The error raised, under a server the middleware cannot end a response under itself, for
    a response the drain ended before its last part (:data:`CUT_CODE`): the server then closes
    the connection without ending the body, so the client sees it incomplete."""
    return ConnectionClosedByDrainError(
        CUT_CODE, detail="the drain ended this response before its last part"
    )
