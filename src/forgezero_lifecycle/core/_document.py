"""The fetched envelope's body read as JSON: strict UTF-8, strict JSON, an object at the top.

Port rule D6 (``tests/conformance/vectors.json`` ``meta.format_notes.port_rules``): strict UTF-8
(one leading BOM skipped), strict JSON (no ``NaN``/``Infinity``), an object at the top level;
anything else is ``RUNTIME_STATE_ENVELOPE_INVALID``.

The envelope must parse exactly what ``JSON.parse`` accepts: lone surrogate escapes, numbers
beyond the double range (they become ``inf`` and then fail canonical JSON with
``RUNTIME_STATE_VALUE_INVALID``, as in JavaScript) and integers of any length. orjson refuses all
three, so it parses first (twice as fast on a 1 MiB envelope) and whatever it refuses is parsed
again by the standard library's exact path, which has the final word.

No I/O and no httpx here: the fetch (:mod:`._fetch`) hands the body over, and the envelope is
read inside the same collector-paused step that opens it (:meth:`._codec.StateCodec.open_body`).
"""

from __future__ import annotations

import json
from typing import Any, Final

import orjson

from .._errors import StateTransferFailedError

__all__ = ["parse_document", "read_document"]

_BOM: Final = b"\xef\xbb\xbf"


def parse_document(body: bytes) -> dict[str, Any]:
    """Decode a body strictly (UTF-8, strict JSON) and return its top-level JSON object."""
    return read_document(body)[0]


def read_document(body: bytes) -> tuple[dict[str, Any], bool]:
    """The body's top-level JSON object, and whether orjson read it.

    When orjson read it, the object holds only ``dict``, ``list``, ``str`` (no lone surrogate),
    ``int`` (within 64 bits), finite ``float``, ``bool`` and ``None``: what
    :func:`forgezero_lifecycle._canonical.canonical_json_of_parsed` needs.
    """
    if body.startswith(_BOM):
        body = body[len(_BOM) :]
    try:
        document, by_orjson = orjson.loads(body), True
    except orjson.JSONDecodeError:
        document, by_orjson = _parse_exactly(body), False
    if not isinstance(document, dict):
        raise StateTransferFailedError("RUNTIME_STATE_ENVELOPE_INVALID")
    return document, by_orjson


def _parse_exactly(body: bytes) -> Any:
    """What ``JSON.parse`` makes of ``body``, or ``RUNTIME_STATE_ENVELOPE_INVALID``."""
    try:
        return json.loads(
            body.decode("utf-8"), parse_constant=_refuse_constant, parse_int=_parse_int
        )
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError included
        raise StateTransferFailedError("RUNTIME_STATE_ENVELOPE_INVALID") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_int(text: str) -> int | float:
    # JSON.parse reads every number as a double; past the double range that is Infinity.
    return int(text) if len(text) <= 400 else float(text)
