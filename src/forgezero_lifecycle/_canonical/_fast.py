"""The fast encoder: orjson's bytes, checked and corrected to the canonical ones.

orjson encodes with sorted keys and escapes strings as ``JSON.stringify`` does; with
:data:`_ORJSON_OPTIONS` it refuses subclasses, dataclasses and datetimes. What orjson still
encodes silently (enums, UUIDs, ``orjson.Fragment``) and the floats it prints unlike
ECMAScript (``100.0``, ``1e+16``, NaN and infinities as ``null``) are found by a walk of the
value level by level (:func:`_floats`), and the float tokens rewritten outside strings. Where
orjson refuses a part (a lone surrogate, an int beyond 2**53, deep nesting) or code point order
may differ from UTF-16 order, only that part is taken apart. A fault raises :class:`RefusedError` or
:class:`StateInputInvalidError`, and the caller asks the exact encoder (:mod:`._exact`) for the verdict.
Under 3x orjson with sorted keys plus SHA-256 on ``bench/canonical.py``'s 1 MiB state.
"""

from __future__ import annotations

import enum
import gc
import math
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, TypeVar, cast

import orjson

from . import _exact
from ._exact import format_number, quote, scalar, sorted_keys

__all__ = ["ENABLED", "RefusedError", "encode", "encode_parsed"]

#: From this depth on the fast encoder hands subtrees to the iterative one (orjson stops at 255).
_FAST_DEPTH: Final = 64
#: Members per group when a refused array or object is taken apart (at least; sqrt(n) if more).
_GROUP: Final = 16
#: With these, orjson refuses subclasses, dataclasses and datetimes; it still encodes UUIDs, enum
#: members and ``orjson.Fragment``, which the walk in :func:`_floats` refuses.
_ORJSON_OPTIONS: Final = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_STRICT_INTEGER
    | orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
)
#: The leaves the walk picks out: floats, and fragments (which have no referents to give them away).
_PICKED: Final = frozenset((float, orjson.Fragment))
#: UTF-8 lead bytes of U+E000..U+FFFF and of U+10000 and above: sorted differently in UTF-16.
_LATE_BMP: Final = (b"\xee", b"\xef")
_ASTRAL: Final = (b"\xf0", b"\xf1", b"\xf2", b"\xf3", b"\xf4")
#: orjson prints a float as repr does in decimal form (1e-5 <= |x| < 1e16) and ``1.5e-7`` style
#: outside; the fast encoder relies on that and is off if this orjson prints otherwise.
_ORJSON_FLOATS_AS_EXPECTED: Final = (
    orjson.dumps([0.1, 100.0, -0.0, 1e-5, 1.5e-7, 1e16, 1e21, 5e-324])
    == b"[0.1,100.0,-0.0,0.00001,1.5e-7,1e+16,1e+21,5e-324]"
)


class _Probe(enum.Enum):
    MEMBER = 1


#: The fast encoder walks a value with ``gc.get_referents``, which gives exactly a list's and a
#: tuple's items and a dict's values (and its keys, if not all are str) in CPython, and for an
#: instance of a class (a UUID, an enum member) its class, which gives itself again through its
#: ``__mro__``, so that a walk that meets one does not end. The fast encoder is off where this
#: does not hold.
_PROBE: Final[list[object]] = ["a", 0.5, (1.5,), {"k": [2.5]}, uuid.UUID(int=1), _Probe.MEMBER]
_REFERENTS_AS_EXPECTED: Final = (
    sorted(map(id, gc.get_referents(_PROBE))) == sorted(map(id, _PROBE))
    and gc.get_referents(_PROBE[2]) == [1.5]
    and gc.get_referents(_PROBE[3]) in ([[2.5]], ["k", [2.5]], [[2.5], "k"])
    and uuid.UUID in gc.get_referents(_PROBE[4])
    and _Probe in gc.get_referents(_PROBE[5])
    and all(
        any(referent is kind.__mro__ for referent in gc.get_referents(kind))
        and any(referent is kind for referent in gc.get_referents(kind.__mro__))
        for kind in (uuid.UUID, _Probe)
    )
)
#: Float tokens orjson prints unlike ECMAScript (rewritten only where they are outside strings).
_INTEGRAL: Final = re.compile(rb"\.0(?=[,\]}]|\Z)")
_NEGATIVE_ZERO: Final = re.compile(rb"-0\.0(?=[,\]}]|\Z)")
_EXPONENT: Final = re.compile(rb"e[-+]\d+(?=[,\]}]|\Z)")

#: Whether the premises above hold in this interpreter and orjson; without them, the exact
#: encoder does all the work.
ENABLED: Final = _ORJSON_FLOATS_AS_EXPECTED and _REFERENTS_AS_EXPECTED

_Token = Callable[[bytes, "re.Match[bytes]"], tuple[int, bytes]]
_T = TypeVar("_T")


class RefusedError(Exception):
    """The fast encoder met something only the exact encoder can judge."""


def encode(value: object, depth: int) -> bytes:
    """orjson's bytes with ECMAScript floats, or the top level by hand if orjson cannot."""
    if depth >= _FAST_DEPTH:
        return _exact.encode(value, depth).encode()
    try:
        encoded = orjson.dumps(value, option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError:  # a lone surrogate, an int beyond 2**53, too deep, a cycle
        return _assemble(value, depth)
    if not encoded.isascii() and _mixes_planes(encoded):
        return _assemble(value, depth)
    floats = _floats(value, len(encoded))
    return _ecmascript_floats(encoded, floats) if floats else encoded


def encode_parsed(value: object) -> bytes | None:
    """orjson's bytes of a value orjson read, when they are already canonical; else None.

    Such a value holds only the exact JSON types, finite floats and well-formed strings (see
    :func:`forgezero_lifecycle.core._document.read_document`), so the walk of :func:`_floats`,
    whose work is to find what is not JSON and the floats, has nothing to find but floats. A
    float orjson prints unlike ECMAScript is an integral one (``100.0``, ``-0.0``) or one in
    exponent form: if neither token shows anywhere in the bytes (inside strings included, to
    stay on the safe side), every float is printed as ECMAScript prints it, and the bytes are the
    canonical ones. Otherwise None: :func:`encode` decides.
    """
    try:
        encoded = orjson.dumps(value, option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError:  # an int beyond 2**53, too deep
        return None
    if not encoded.isascii() and _mixes_planes(encoded):
        return None
    if _INTEGRAL.search(encoded) is not None or _EXPONENT.search(encoded) is not None:
        return None
    return encoded


def _mixes_planes(encoded: bytes) -> bool:
    """Whether code point and UTF-16 order might disagree on some pair of strings in here."""
    return any(lead in encoded for lead in _LATE_BMP) and any(lead in encoded for lead in _ASTRAL)


def _assemble(value: object, depth: int) -> bytes:
    """Encode what orjson refused one level down, keys in UTF-16 order.

    Members go back to :func:`encode` in groups of about sqrt(n), and a group that fails
    again member by member, so a fault costs a few orjson calls, not one per member.
    """
    kind = type(value)  # exact types: _scalar refuses a subclass, naming it
    if kind is dict:
        mapping = cast("dict[object, object]", value)
        keys = sorted_keys(mapping)
        if len(keys) > _GROUP:
            groups = ({key: mapping[key] for key in group} for group in _groups(keys))
            return b"{" + b",".join(encode(group, depth)[1:-1] for group in groups) + b"}"
        members = (quote(key).encode() + b":" + encode(mapping[key], depth + 1) for key in keys)
        return b"{" + b",".join(members) + b"}"
    if kind is list or kind is tuple:
        items = cast("Sequence[object]", value)
        if len(items) > _GROUP:
            parts = (encode(list(group), depth)[1:-1] for group in _groups(items))
            return b"[" + b",".join(parts) + b"]"
        return b"[" + b",".join(encode(member, depth + 1) for member in items) + b"]"
    return scalar(value).encode()


def _groups(items: Sequence[_T]) -> Iterator[Sequence[_T]]:
    size = max(_GROUP, math.isqrt(len(items)))
    return (items[start : start + size] for start in range(0, len(items), size))


def _floats(value: object, size: int) -> list[float]:
    """Every float in ``value``, which orjson encoded in ``size`` bytes; refuses what is not JSON.

    With :data:`_ORJSON_OPTIONS`, orjson encodes the exact JSON types and also UUIDs, enum
    members and ``orjson.Fragment``. The walk goes breadth first, a whole level of the tree per
    step: one comprehension picks out its floats and fragments, and ``gc.get_referents`` gives
    the next level, a list's or tuple's items and a dict's values (and keys, for a dict whose keys
    are not all ``str``). A UUID or an enum member gives its class, and a class gives itself
    again, so such a walk never ends: it is refused once it has met more objects than ``size``,
    more than a JSON text of ``size`` bytes holds (for a 1 MiB value, a walk about as long as
    the exact encoder's refusal that follows). A fragment has no referents; ``sum`` of the
    picked leaves refuses it. So each object costs one type test.
    """
    picked: list[Any] = []
    level: list[Any] = [value]
    budget = size
    while level:
        budget -= len(level)
        if budget < 0:
            raise RefusedError
        picked += [item for item in level if type(item) in _PICKED]
        level = gc.get_referents(*level)
    try:
        sum(picked, 0.0)  # C speed over floats; a TypeError at a fragment
    except TypeError:
        raise RefusedError from None
    return picked


def _ecmascript_floats(encoded: bytes, floats: list[float]) -> bytes:
    """orjson's bytes with each float token that ECMAScript prints otherwise rewritten.

    orjson prints ``100.0`` where ECMAScript prints ``100``, and uses exponent form outside
    1e-5 <= |x| < 1e16 where ECMAScript does outside 1e-6 <= |x| < 1e21. orjson's own printing
    of the floats alone says which of these occur: ``null`` for NaN or an infinity (refused),
    an ``e`` for an exponent, ``.0`` for an integral float in decimal form, ``-0.0``.
    """
    summary = orjson.dumps(floats)
    if b"n" in summary:
        raise RefusedError
    if b"e" in summary:
        encoded = _rewrite(encoded, _EXPONENT, _exponent_token)
    integral = summary.count(b".0,") + summary.endswith(b".0]")
    if not integral:
        return encoded
    if not (b"-0.0," in summary or summary.endswith(b"-0.0]")):  # a token exactly -0.0
        dropped, found = _INTEGRAL.subn(b"", encoded)
        if found == integral:  # one match per integral float: none was inside a string
            return dropped
    return _rewrite(encoded, _INTEGRAL, _integral_token)


def _rewrite(encoded: bytes, pattern: re.Pattern[bytes], token: _Token) -> bytes:
    """``encoded`` with each match of ``pattern`` outside strings replaced as ``token`` says.

    A match with an odd number of quotes before it is inside a string. Escaped backslashes and
    quotes are masked first, keeping every offset.
    """
    masked = encoded.replace(b"\\\\", b"__").replace(b'\\"', b"__") if b"\\" in encoded else encoded
    pieces: list[bytes] = []
    done = counted = quotes = 0
    for match in pattern.finditer(masked):
        start = match.start()
        quotes += masked.count(b'"', counted, start)
        counted = start
        if quotes % 2 == 0:
            start, text = token(masked, match)
            pieces += (encoded[done:start], text)
            done = match.end()
    pieces.append(encoded[done:])
    return b"".join(pieces)


def _integral_token(masked: bytes, match: re.Match[bytes]) -> tuple[int, bytes]:
    """``12.0`` is ``12``: drop the ``.0``; ``-0.0`` is ``0``."""
    start = match.start()
    return (start - 2, b"0") if masked[start - 2 : start] == b"-0" else (start, b"")


def _exponent_token(masked: bytes, match: re.Match[bytes]) -> tuple[int, bytes]:
    """``1e+16`` is ``10000000000000000``: the whole number again, as ECMAScript prints it."""
    start = match.start()
    while start and masked[start - 1] in b"-.0123456789":
        start -= 1
    return start, format_number(float(masked[start : match.end()])).encode()
