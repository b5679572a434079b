"""What a finished attempt leaves in a job's row: the result as JSON, the error text, and when
a failed job runs again (the worker's default ``backoff``)."""

from __future__ import annotations

from typing import Any

import orjson

from .._errors import JobInvalidError
from ._enqueue import check_json_data, is_plain_json

__all__ = ["MAX_ERROR_CHARS", "error_text", "exponential_backoff", "result_json"]

#: Longest ``last_error`` text a store keeps.
MAX_ERROR_CHARS = 2000


def exponential_backoff(attempts: int, *, base: float = 1.0, cap: float = 300.0) -> float:
    """Seconds to wait before retry number ``attempts`` (1, 2, 4, ... capped at ``cap``)."""
    return float(min(cap, base * 2 ** max(0, min(attempts - 1, 30))))


def result_json(result: Any) -> str | None:
    """A handler's result as JSON (``None`` stays SQL NULL), or :class:`JobInvalidError`.

    A result follows a payload's rules (:func:`~._enqueue.check_json_data`), at any top level
    value: no ``NaN`` (orjson would write ``null``), no ``datetime`` or ``UUID`` (a string when
    read back), no NUL (PostgreSQL's ``jsonb`` refuses it, which would fail the whole batch as
    ``JOB_STORE_UNAVAILABLE``), nothing nested deeper than orjson encodes or holding itself.
    Every store calls this before it writes, so a refused result writes nothing and the lease
    is still held; the worker then fails the attempt as for a handler exception.
    """
    if result is None:
        return None
    if not is_plain_json(result):
        check_json_data(result, "result")
    try:
        text = orjson.dumps(result, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as error:  # a lone surrogate or an int beyond 64 bits
        raise JobInvalidError(detail=f"a job result must be JSON data: {error}") from None
    return text.decode()


def error_text(error: str) -> str:
    return error[:MAX_ERROR_CHARS]
