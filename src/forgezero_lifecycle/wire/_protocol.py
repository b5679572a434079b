"""The control protocol's constants and plain checks, importable without pydantic.

What a runtime needs before its first control request (the timeout bounds it checks its own
settings against, the nonce and revision shapes, the drain states) lives here, so importing the
runtime does not import pydantic (about 13 MiB resident once the wire models are built): the
models of :mod:`~forgezero_lifecycle.wire.drain` and :mod:`~forgezero_lifecycle.wire.handoff` load
on the first request that carries one.

Values follow the JavaScript `@forgezero/runtime` lifecycle module, which checks them with
``RegExp.test`` and ``Number.isSafeInteger``; patterns match the whole string
(``re.fullmatch``), since Python's ``$`` also matches before a final newline.
"""

from __future__ import annotations

import re
from typing import Any, Final, Literal, TypeGuard

__all__ = [
    "DRAIN_PROTOCOL",
    "MAX_DRAIN_TIMEOUT_MS",
    "MAX_SAFE_INTEGER",
    "MIN_DRAIN_TIMEOUT_MS",
    "NONCE_PATTERN",
    "REFUSAL_BODY",
    "REVISION_PATTERN",
    "DrainState",
    "deadline_ms",
    "deadline_problem",
    "is_nonce",
    "is_revision",
    "safe_int",
]

#: The body of the 503 that refuses a request once intake is closed (the JavaScript generation's
#: too), whoever sends it: the middleware, or ``serve``'s stop at the socket.
REFUSAL_BODY: Final = b'{"error":"RUNTIME_DRAINING"}'

DRAIN_PROTOCOL: Final = "forgezero-drain/v1"
MIN_DRAIN_TIMEOUT_MS: Final = 100
MAX_DRAIN_TIMEOUT_MS: Final = 600_000
MAX_SAFE_INTEGER: Final = 2**53 - 1

NONCE_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{43}")
REVISION_PATTERN: Final = re.compile(r"[a-f0-9]{40}")

DrainState = Literal["draining", "drained", "failed", "rolled-back"]


def deadline_problem(milliseconds: int) -> str | None:
    """Why ``milliseconds`` cannot be a drain's (or a state handoff's) deadline, or None: the
    wire's ``timeoutMs`` bound, 100 ms to 10 min. Every check of a deadline calls this."""
    if milliseconds < MIN_DRAIN_TIMEOUT_MS:
        return f"too short: a deadline is at least {MIN_DRAIN_TIMEOUT_MS}ms"
    if milliseconds > MAX_DRAIN_TIMEOUT_MS:
        return f"too long: a deadline is at most {MAX_DRAIN_TIMEOUT_MS // 60_000}m"
    return None


def deadline_ms(seconds: float) -> int:
    """``seconds`` as a ``timeoutMs`` within the bound of :func:`deadline_problem` (a deadline
    the library computes itself is brought into it rather than refused)."""
    milliseconds = round(seconds * 1000)
    problem = deadline_problem(milliseconds)
    if problem is None:
        return milliseconds
    return MIN_DRAIN_TIMEOUT_MS if milliseconds < MIN_DRAIN_TIMEOUT_MS else MAX_DRAIN_TIMEOUT_MS


def safe_int(value: Any) -> int:
    """Return ``value`` as an int when it is a JavaScript safe integer, else raise ValueError.

    Booleans and strings are refused; integral floats are accepted.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("expected a JSON number")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("expected an integer")
        value = int(value)
    if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        raise ValueError("expected a safe integer")
    return int(value)


def is_nonce(value: object) -> TypeGuard[str]:
    """True when ``value`` is a str of 43 base64url characters (a nonce)."""
    return isinstance(value, str) and NONCE_PATTERN.fullmatch(value) is not None


def is_revision(value: object) -> TypeGuard[str]:
    """True when ``value`` is a str of 40 lowercase hex characters (a revision)."""
    return isinstance(value, str) and REVISION_PATTERN.fullmatch(value) is not None
