"""What a finished attempt leaves in a job's row: the result as JSON, the error text, and when
a failed job runs again (the worker's default ``backoff``)."""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["MAX_ERROR_CHARS", "error_text", "exponential_backoff", "result_json"]

#: Longest ``last_error`` text a store keeps.
MAX_ERROR_CHARS = 2000


def exponential_backoff(attempts: int, *, base: float = 1.0, cap: float = 300.0) -> float:
    """Seconds to wait before retry number ``attempts`` (1, 2, 4, ... capped at ``cap``)."""
    return float(min(cap, base * 2 ** max(0, min(attempts - 1, 30))))


def result_json(result: Any) -> str | None:
    """A handler's result as JSON (``None`` stays SQL NULL)."""
    return None if result is None else orjson.dumps(result, option=orjson.OPT_SORT_KEYS).decode()


def error_text(error: str) -> str:
    return error[:MAX_ERROR_CHARS]
