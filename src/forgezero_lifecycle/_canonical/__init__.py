"""Canonical JSON and state digests, byte-identical to the JavaScript ``@forgezero/runtime``
lifecycle module's ``canonicalJson``.

The rules (RFC 8785, except that lone surrogates are escaped and integers beyond 2**53 are
rounded to doubles, as the JavaScript does):

* Accepted values are ``None``, ``bool``, ``int``, ``float``, ``str``, ``list``, ``tuple`` (an
  array) and ``dict`` with ``str`` keys, by exact type: subclasses (enums, ``OrderedDict``), NaN,
  infinities, cycles and nesting deeper than :data:`MAX_DEPTH` raise :class:`StateInputInvalidError`
  with code ``RUNTIME_STATE_VALUE_INVALID``.
* No whitespace. Object keys are sorted by UTF-16 code units, as ``Array.prototype.sort`` does
  (this differs from code point order when a key holds a character above U+FFFF).
* Strings are escaped as ``JSON.stringify`` escapes them: ``\\"``, ``\\\\``, ``\\b \\f \\n \\r
  \\t``, other control characters as lowercase ``\\u00xx``, lone surrogates as ``\\udxxx``; all
  other text is raw UTF-8. A Python string is read as UTF-16, so two surrogate code points
  that form a pair are the character they encode.
* Numbers are formatted by ECMAScript ``Number::toString``: ``1e+21``, ``1e-7``, ``100`` for
  ``100.0``, ``0`` for ``-0.0``; an int beyond 2**53 is first rounded to the nearest double.

Two encoders give the same bytes. The exact one (:mod:`._exact`) builds the text value by value
and alone words refusals; the fast one (:mod:`._fast`) lets orjson encode and corrects what
orjson does unlike the JavaScript. :func:`canonical_json` tries the fast one and on any fault
lets the exact one decide, so an error names the place of the fault by array index and never
shows object keys: keys are state data.
"""

from __future__ import annotations

import hashlib

from .._errors import StateInputInvalidError
from . import _exact, _fast
from ._exact import MAX_DEPTH

__all__ = ["MAX_DEPTH", "canonical_json", "canonical_json_of_parsed", "digest_of", "state_digest"]


def canonical_json(value: object) -> bytes:
    """The canonical JSON of ``value`` as UTF-8 bytes (the JavaScript ``canonicalJson``).

    Raises :class:`StateInputInvalidError` (``RUNTIME_STATE_VALUE_INVALID``) for a value JSON cannot
    hold: another type, NaN or an infinity, an int beyond the largest double, a cycle, or
    nesting deeper than :data:`MAX_DEPTH`.
    """
    if _fast.ENABLED:
        try:
            return _fast.encode(value, 0)
        except (
            _fast.RefusedError,
            StateInputInvalidError,
            RecursionError,
        ):  # the latter on a deep stack
            pass
    return _exact.encode(value, 0).encode()  # or refuses, naming the place of the fault


def canonical_json_of_parsed(value: object) -> bytes:
    """:func:`canonical_json` of a value that ``orjson.loads`` returned, the same bytes or error.

    Only for such a value (exact JSON types, finite floats, no lone surrogate): when orjson's
    sorted encoding has no float token ECMAScript prints otherwise, it is the canonical JSON and
    is returned as it is; else :func:`canonical_json` does the work.
    """
    if _fast.ENABLED:
        encoded = _fast.encode_parsed(value)
        if encoded is not None:
            return encoded
    return canonical_json(value)


def state_digest(value: object) -> str:
    """``"sha256:"`` and the lowercase hex SHA-256 of :func:`canonical_json` of ``value``."""
    return digest_of(canonical_json(value))


def digest_of(encoded: bytes) -> str:
    """The state digest of bytes already produced by :func:`canonical_json`."""
    return "sha256:" + hashlib.sha256(encoded).hexdigest()
