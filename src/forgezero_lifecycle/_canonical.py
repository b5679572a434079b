"""Canonical JSON and state digests, byte-identical to the JavaScript ``@forgezero/runtime``
lifecycle module's ``canonicalJson``.

The rules (RFC 8785, except that lone surrogates are escaped and integers beyond 2**53 are
rounded to doubles, as the JavaScript does):

* Accepted values are ``None``, ``bool``, ``int``, ``float``, ``str``, ``list``, ``tuple`` (an
  array) and ``dict`` with ``str`` keys, by exact type: subclasses (enums, ``OrderedDict``), NaN,
  infinities, cycles and nesting deeper than :data:`MAX_DEPTH` raise :class:`StateInputInvalid`
  with code ``RUNTIME_STATE_VALUE_INVALID``.
* No whitespace. Object keys are sorted by UTF-16 code units, as ``Array.prototype.sort`` does
  (this differs from code point order when a key holds a character above U+FFFF).
* Strings are escaped as ``JSON.stringify`` escapes them: ``\\"``, ``\\\\``, ``\\b \\f \\n \\r
  \\t``, other control characters as lowercase ``\\u00xx``, lone surrogates as ``\\udxxx``; all
  other text is raw UTF-8. A Python string is read as UTF-16, so two surrogate code points
  that form a pair are the character they encode.
* Numbers are formatted by ECMAScript ``Number::toString``: ``1e+21``, ``1e-7``, ``100`` for
  ``100.0``, ``0`` for ``-0.0``; an int beyond 2**53 is first rounded to the nearest double.

Two encoders give the same bytes. The exact one is iterative and handles everything, errors
included (about 150 ms per MiB). The fast one (under 3x orjson with sorted keys; see
``bench/canonical.py``) lets orjson encode, with sorted keys and strings escaped as
JSON.stringify escapes them, and subclasses, dataclasses and datetimes refused; walks the value
level by level in C-speed passes, to collect its floats and to refuse what orjson still encodes
silently (enums, UUIDs, ``orjson.Fragment``; NaN and infinities it prints as ``null``); and
rewrites the float tokens orjson prints unlike ECMAScript (``100.0``, ``1e+16``). Where orjson refuses a part (a lone surrogate, an int beyond
2**53, deep nesting) or code point order may differ from UTF-16 order, only that part is taken
apart. A fault goes to the exact encoder, whose message names the place by array index and never
shows object keys: keys are state data.
"""

from __future__ import annotations

import enum
import gc
import hashlib
import math
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from itertools import chain, count, pairwise, repeat
from json.encoder import encode_basestring
from typing import Any, Final, TypeVar, cast

import orjson

from ._errors import StateInputInvalid

__all__ = ["MAX_DEPTH", "canonical_json", "digest_of", "state_digest"]

#: The deepest nesting of arrays and objects that is encoded.
MAX_DEPTH: Final = 1000
#: From this depth on the fast encoder hands subtrees to the iterative one (orjson stops at 255).
_FAST_DEPTH: Final = 64
#: Members per group when a refused array or object is taken apart (at least; sqrt(n) if more).
_GROUP: Final = 16
_SAFE_INTEGER: Final = 2**53
_CODE: Final = "RUNTIME_STATE_VALUE_INVALID"
_SURROGATE: Final = re.compile("[\ud800-\udfff]")

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


_Path = Sequence["str | int"]
_Members = Iterator[tuple[str, "str | int", object]]
_Token = Callable[[bytes, "re.Match[bytes]"], tuple[int, bytes]]
_T = TypeVar("_T")


class _Refused(Exception):
    """The fast encoder met something only the exact encoder can judge."""


def canonical_json(value: object) -> bytes:
    """The canonical JSON of ``value`` as UTF-8 bytes (the JavaScript ``canonicalJson``).

    Raises :class:`StateInputInvalid` (``RUNTIME_STATE_VALUE_INVALID``) for a value JSON cannot
    hold: another type, NaN or an infinity, an int beyond the largest double, a cycle, or
    nesting deeper than :data:`MAX_DEPTH`.
    """
    if _ORJSON_FLOATS_AS_EXPECTED and _REFERENTS_AS_EXPECTED:
        try:
            return _serialize(value, 0)
        except (_Refused, StateInputInvalid, RecursionError):  # the latter on a deep call stack
            pass
    return _exact(value, 0).encode()  # or refuses, naming the place of the fault


def state_digest(value: object) -> str:
    """``"sha256:"`` and the lowercase hex SHA-256 of :func:`canonical_json` of ``value``."""
    return digest_of(canonical_json(value))


def digest_of(encoded: bytes) -> str:
    """The state digest of bytes already produced by :func:`canonical_json`."""
    return "sha256:" + hashlib.sha256(encoded).hexdigest()


def _invalid(detail: str) -> StateInputInvalid:
    return StateInputInvalid(_CODE, detail=detail)


# -- scalars ----------------------------------------------------------------------------------


def _quote(text: str) -> str:
    """``JSON.stringify`` of a string."""
    quoted = encode_basestring(text)
    if _SURROGATE.search(quoted) is None:
        return quoted
    paired = quoted.encode("utf-16-be", "surrogatepass").decode("utf-16-be", "surrogatepass")
    return _SURROGATE.sub(lambda lone: f"\\u{ord(lone.group()):04x}", paired)


def _number(number: float, path: _Path = ()) -> str:
    """ECMAScript ``Number::toString`` of a double, from Python's shortest repr."""
    if not math.isfinite(number):
        raise _invalid(f"{number!r} at {_where(path)}: JSON has no NaN or Infinity; use null")
    if number == 0:
        return "0"
    text = repr(number)
    if "e" not in text:
        return text.removesuffix(".0")
    mantissa, _, exponent = text.partition("e")
    sign = "-" if mantissa.startswith("-") else ""
    digits = mantissa.lstrip("-").replace(".", "")
    size, point = len(digits), int(exponent) + 1  # number = 0.<digits> * 10**point
    if size <= point <= 21:
        return sign + digits + "0" * (point - size)
    if 0 < point <= 21:
        return f"{sign}{digits[:point]}.{digits[point:]}"
    if -6 < point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    fraction = f".{digits[1:]}" if size > 1 else ""
    return f"{sign}{digits[0]}{fraction}e{point - 1:+d}"


def _integer(number: int, path: _Path = ()) -> str:
    if -_SAFE_INTEGER <= number <= _SAFE_INTEGER:
        return str(number)
    try:
        return _number(float(number), path)
    except OverflowError:
        raise _invalid(f"an int at {_where(path)} is beyond the largest double") from None


def _scalar(value: object, path: _Path = ()) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    kind = type(value)
    if kind is str:
        return _quote(cast(str, value))
    if kind is int:
        return _integer(cast(int, value), path)
    if kind is float:
        return _number(cast(float, value), path)
    raise _invalid(
        f"a {kind.__module__}.{kind.__qualname__} at {_where(path)}: state values must be "
        "None, bool, int, float, str, list, tuple or dict with str keys (convert it first)"
    )


# -- the exact encoder ------------------------------------------------------------------------


def _utf16(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def _sorted_keys(mapping: dict[object, object], path: _Path = ()) -> list[str]:
    """The keys in UTF-16 code unit order; refuses non-str keys and keys equal in UTF-16."""
    for key in mapping:
        if type(key) is not str:
            kind = type(key).__name__
            raise _invalid(f"an object at {_where(path)} has a key of type {kind}; use str keys")
    keys = sorted(cast("dict[str, object]", mapping), key=_utf16)
    for before, after in pairwise(keys):
        if _utf16(before) == _utf16(after):
            raise _invalid(f"an object at {_where(path)} has two keys that are one UTF-16 string")
    return keys


def _members(container: object, path: _Path) -> _Members:
    if isinstance(container, dict):
        keys = _sorted_keys(container, path)
        return (
            (("," if i else "{") + _quote(k) + ":", k, container[k]) for i, k in enumerate(keys)
        )
    assert isinstance(container, list | tuple)
    return zip(chain("[", repeat(",")), count(), container)


def _where(path: _Path) -> str:
    """A JSONPath to the current value: indices shown, object keys as ``*`` (they are data)."""
    steps = [f"[{step}]" if isinstance(step, int) else ".*" for step in path[:12]]
    return "$" + "".join(steps) + ("..." if len(path) > 12 else "")


def _exact(value: object, depth: int) -> str:
    """The reference encoder: iterative, so nesting is bounded by MAX_DEPTH, not by the stack."""
    parts: list[str] = []
    frames: list[tuple[_Members, str, int]] = []
    path: list[str | int] = []
    active: set[int] = set()
    item = value
    while True:
        kind = type(item)
        if kind is dict or kind is list or kind is tuple:
            if id(item) in active:
                raise _invalid(f"the value at {_where(path)} contains itself; break the cycle")
            if depth + len(frames) >= MAX_DEPTH:
                raise _invalid(f"the value nests deeper than {MAX_DEPTH} arrays and objects")
            if item:
                active.add(id(item))
                frames.append((_members(item, path), "}" if kind is dict else "]", id(item)))
                path.append("")
            else:
                parts.append("{}" if kind is dict else "[]")
        else:
            parts.append(_scalar(item, path))
        while frames:
            members, closer, ident = frames[-1]
            member = next(members, None)
            if member is not None:
                prefix, path[-1], item = member
                parts.append(prefix)
                break
            parts.append(closer)
            active.discard(ident)
            frames.pop()
            path.pop()
        else:
            return "".join(parts)


# -- the fast encoder -------------------------------------------------------------------------


def _serialize(value: object, depth: int) -> bytes:
    """orjson's bytes with ECMAScript floats, or the top level by hand if orjson cannot."""
    if depth >= _FAST_DEPTH:
        return _exact(value, depth).encode()
    try:
        encoded = orjson.dumps(value, option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError:  # a lone surrogate, an int beyond 2**53, too deep, a cycle
        return _assemble(value, depth)
    if not encoded.isascii() and _mixes_planes(encoded):
        return _assemble(value, depth)
    floats = _floats(value, len(encoded))
    return _ecmascript_floats(encoded, floats) if floats else encoded


def _mixes_planes(encoded: bytes) -> bool:
    """Whether code point and UTF-16 order might disagree on some pair of strings in here."""
    return any(lead in encoded for lead in _LATE_BMP) and any(lead in encoded for lead in _ASTRAL)


def _assemble(value: object, depth: int) -> bytes:
    """Encode what orjson refused one level down, keys in UTF-16 order.

    Members go back to :func:`_serialize` in groups of about sqrt(n), and a group that fails
    again member by member, so a fault costs a few orjson calls, not one per member.
    """
    kind = type(value)  # exact types: _scalar refuses a subclass, naming it
    if kind is dict:
        mapping = cast("dict[object, object]", value)
        keys = _sorted_keys(mapping)
        if len(keys) > _GROUP:
            groups = ({key: mapping[key] for key in group} for group in _groups(keys))
            return b"{" + b",".join(_serialize(group, depth)[1:-1] for group in groups) + b"}"
        members = (
            _quote(key).encode() + b":" + _serialize(mapping[key], depth + 1) for key in keys
        )
        return b"{" + b",".join(members) + b"}"
    if kind is list or kind is tuple:
        items = cast("Sequence[object]", value)
        if len(items) > _GROUP:
            parts = (_serialize(list(group), depth)[1:-1] for group in _groups(items))
            return b"[" + b",".join(parts) + b"]"
        return b"[" + b",".join(_serialize(member, depth + 1) for member in items) + b"]"
    return _scalar(value).encode()


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
    the exact encoder's refusal that follows). A fragment has no referents; ``sum`` of the picked leaves refuses
    it. Per object this is one type test, where a set of each level's types and a second pass for
    the floats cost two.
    """
    picked: list[Any] = []
    level: list[Any] = [value]
    budget = size
    while level:
        budget -= len(level)
        if budget < 0:
            raise _Refused
        picked += [item for item in level if type(item) in _PICKED]
        level = gc.get_referents(*level)
    try:
        sum(picked, 0.0)  # C speed over floats; a TypeError at a fragment
    except TypeError:
        raise _Refused from None
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
        raise _Refused
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
    return start, _number(float(masked[start : match.end()])).encode()
