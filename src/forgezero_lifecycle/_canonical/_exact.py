"""The reference encoder: canonical JSON built value by value, and every refusal, placed.

Iterative, so nesting is bounded by :data:`MAX_DEPTH` rather than by the call stack, and slow
(over 100 ms per MiB of JSON). It alone decides what is refused and words the message: the
place of the fault by array index, with object keys shown as ``*`` because keys are state data.
The fast encoder (:mod:`._fast`) borrows its scalars and its key order.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from itertools import chain, count, pairwise, repeat
from json.encoder import encode_basestring
from typing import Final, cast

from .._errors import StateInputInvalidError

__all__ = ["MAX_DEPTH", "Path", "encode", "format_number", "quote", "scalar", "sorted_keys"]

#: The deepest nesting of arrays and objects that is encoded.
MAX_DEPTH: Final = 1000
_SAFE_INTEGER: Final = 2**53
_CODE: Final = "RUNTIME_STATE_VALUE_INVALID"
_SURROGATE: Final = re.compile("[\ud800-\udfff]")

Path = Sequence["str | int"]
_Members = Iterator[tuple[str, "str | int", object]]


def _invalid(detail: str) -> StateInputInvalidError:
    return StateInputInvalidError(_CODE, detail=detail)


# -- scalars ----------------------------------------------------------------------------------


def quote(text: str) -> str:
    """``JSON.stringify`` of a string."""
    quoted = encode_basestring(text)
    if _SURROGATE.search(quoted) is None:
        return quoted
    paired = quoted.encode("utf-16-be", "surrogatepass").decode("utf-16-be", "surrogatepass")
    return _SURROGATE.sub(lambda lone: f"\\u{ord(lone.group()):04x}", paired)


def format_number(number: float, path: Path = ()) -> str:
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


def _integer(number: int, path: Path = ()) -> str:
    if -_SAFE_INTEGER <= number <= _SAFE_INTEGER:
        return str(number)
    try:
        return format_number(float(number), path)
    except OverflowError:
        raise _invalid(f"an int at {_where(path)} is beyond the largest double") from None


def scalar(value: object, path: Path = ()) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    kind = type(value)
    if kind is str:
        return quote(cast(str, value))
    if kind is int:
        return _integer(cast(int, value), path)
    if kind is float:
        return format_number(cast(float, value), path)
    raise _invalid(
        f"a {kind.__module__}.{kind.__qualname__} at {_where(path)}: state values must be "
        "None, bool, int, float, str, list, tuple or dict with str keys (convert it first)"
    )


# -- the exact encoder ------------------------------------------------------------------------


def _utf16(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def sorted_keys(mapping: dict[object, object], path: Path = ()) -> list[str]:
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


def _members(container: object, path: Path) -> _Members:
    if isinstance(container, dict):
        keys = sorted_keys(container, path)
        return ((("," if i else "{") + quote(k) + ":", k, container[k]) for i, k in enumerate(keys))
    assert isinstance(container, list | tuple)
    return zip(chain("[", repeat(",")), count(), container)


def _where(path: Path) -> str:
    """A JSONPath to the current value: indices shown, object keys as ``*`` (they are data)."""
    steps = [f"[{step}]" if isinstance(step, int) else ".*" for step in path[:12]]
    return "$" + "".join(steps) + ("..." if len(path) > 12 else "")


def encode(value: object, depth: int) -> str:
    """The canonical JSON of ``value``, found at ``depth``; refuses what JSON cannot hold."""
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
            parts.append(scalar(item, path))
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
