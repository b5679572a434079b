"""Structured events: one log record per lifecycle step, with a stable name and fields.

A record's message is ``"<event> key=value ..."`` (``%``-style arguments, for plain text logs),
and the same fields arrive on the record through ``extra=``: ``record.event`` holds the name and
each field is an attribute of its own, so a JSON formatter indexes them without parsing text.
Fields never hold a token or a handoff value; a nonce appears as its first 8 characters
(``nonce_prefix``). The library never configures handlers. The events are listed in the README
section "Logs".
"""

from __future__ import annotations

import logging

__all__ = ["emit", "nonce_prefix"]


def emit(logger: logging.Logger, level: int, event: str, /, **fields: object) -> None:
    """Log ``event`` once at ``level`` with ``fields`` both in the message and as attributes."""
    if not logger.isEnabledFor(level):
        return
    message = " ".join([event, *(f"{key}=%s" for key in fields)])
    logger.log(level, message, *fields.values(), extra={"event": event, **fields})


def nonce_prefix(nonce: str) -> str:
    """Enough of a nonce to tell drains apart in logs (never the whole of it)."""
    return nonce[:8]
