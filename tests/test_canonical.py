"""Canonical JSON: the rules one by one, and the fast encoder against the exact one."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import hashlib
import inspect
import json
import math
import re
import sys
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forgezero_lifecycle._canonical import (
    MAX_DEPTH,
    _exact,
    _fast,
    canonical_json,
    canonical_json_of_parsed,
    state_digest,
)
from forgezero_lifecycle._errors import StateInputInvalidError

from .conformance._vectors import expected, vectors


def exact(value: object) -> bytes:
    return _exact.encode(value, 0).encode()


def fast(value: object) -> bytes:
    return _fast.encode(value, 0)


def refusal(value: object) -> StateInputInvalidError:
    with pytest.raises(StateInputInvalidError) as caught:
        canonical_json(value)
    assert caught.value.code == "RUNTIME_STATE_VALUE_INVALID"
    return caught.value


def nested_lists(depth: int) -> list[Any]:
    outer: list[Any] = []
    inner = outer
    for _ in range(depth - 1):
        inner.append([])
        inner = inner[0]
    return outer


class Colour(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    LOW = 1


class Mode(enum.StrEnum):
    FAST = "fast"


class Tags(list[str]):
    pass


class Name(str):
    pass


class Ratio(float):
    pass


@dataclasses.dataclass
class Point:
    x: int


# -- types ------------------------------------------------------------------------------------


def test_bool_is_true_false() -> None:
    """Python's bool is an int subclass, but JSON has true and false."""
    assert canonical_json([True, 1, False, 0, 1.0]) == b"[true,1,false,0,1]"
    assert canonical_json({"on": True, "off": False}) == b'{"off":false,"on":true}'


def test_tuples_are_arrays() -> None:
    """A tuple encodes as the list with the same items."""
    assert canonical_json(((1, "a"), {"k": (True,)}, ())) == b'[[1,"a"],{"k":[true]},[]]'


@pytest.mark.parametrize(
    "value",
    [
        set(),
        frozenset(),
        b"bytes",
        bytearray(b"x"),
        1j,
        decimal.Decimal("1.5"),
        datetime.datetime(2024, 2, 29, tzinfo=datetime.UTC),
        uuid.UUID(int=7),
        Colour.RED,
        Level.LOW,
        Mode.FAST,
        orjson.Fragment(b"1"),
        collections.OrderedDict(a=1),
        collections.defaultdict(int),
        Tags(["a"]),
        Name("a"),
        Ratio(0.5),
        Point(1),
        object(),
    ],
    ids=lambda value: type(value).__name__,
)
def test_non_json_types_refused(value: object) -> None:
    """Only the exact JSON types pass; enums, UUIDs, subclasses and the rest are refused."""
    for wrapped in (value, [1, value], {"a": {"b": [value]}}):
        assert type(value).__name__ in str(refusal(wrapped).detail)


@pytest.mark.parametrize(
    "value", [{1: "a"}, {None: 1}, {("a",): 1}, {Mode.FAST: 1}, {Name("k"): 1}]
)
def test_non_str_keys_refused(value: dict[Any, Any]) -> None:
    """Object keys must be str (JavaScript would have turned them into text)."""
    assert "key" in str(refusal({"outer": [value]}).detail)


# -- numbers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (0.0, "0"),
        (-0.0, "0"),
        (100.0, "100"),
        (-5.0, "-5"),
        (1e15, "1000000000000000"),
        (1e16, "10000000000000000"),
        (1.5e20, "150000000000000000000"),
        (1e21, "1e+21"),
        (-1.5e21, "-1.5e+21"),
        (0.1, "0.1"),
        (0.30000000000000004, "0.30000000000000004"),
        (1e-5, "0.00001"),
        (1e-6, "0.000001"),
        (-1.5e-6, "-0.0000015"),
        (1e-7, "1e-7"),
        (1.5e-7, "1.5e-7"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (2**53, "9007199254740992"),
        (2**53 + 1, "9007199254740992"),
        (-(2**53) - 1, "-9007199254740992"),
        (10**21, "1e+21"),
        (123456789012345678901, "123456789012345680000"),
    ],
)
def test_numbers_print_as_ecmascript(number: float, text: str) -> None:
    """Floats and ints beyond 2**53 print as JSON.stringify prints the double, wherever they are."""
    assert canonical_json(number) == text.encode()
    assert canonical_json([number, "x"]) == f'[{text},"x"]'.encode()
    assert canonical_json({"n": number}) == f'{{"n":{text}}}'.encode()


@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf, 10**400])
def test_nan_inf_big_ints_refused(number: float) -> None:
    """JSON has no NaN or Infinity (JavaScript's canonicalJson throws on them)."""
    assert "$[1].*[0]" in str(refusal([0, {"k": [number]}]).detail)


def test_errors_hide_object_keys() -> None:
    """Keys are state data (a session id, say), so the place is named without them."""
    detail = str(refusal({"session-4f2a9c": {"score": math.nan}}).detail)
    assert "session" not in detail
    assert "score" not in detail
    assert "$.*.*" in detail


# -- strings and keys -------------------------------------------------------------------------


def test_strings_escaped_like_js() -> None:
    """Short escapes, lowercase \\u00xx for other controls, everything else raw UTF-8."""
    text = '\x00\x08\x0c\n\r\t\x1f\x7f"\\/\u2028é😀'
    want = '"\\u0000\\b\\f\\n\\r\\t\\u001f\x7f\\"\\\\/\u2028é😀"'
    assert canonical_json(text) == want.encode()


def test_lone_surrogates_escaped() -> None:
    """A str is read as UTF-16: a lone surrogate prints as \\udxxx, a split pair as its character."""
    assert canonical_json(["\ud800", "a\udc00b"]) == b'["\\ud800","a\\udc00b"]'
    assert canonical_json("\ud83d\ude00") == '"😀"'.encode()
    assert canonical_json({"\udc00": 1, "\ud800\udc00": 2}) == '{"𐀀":2,"\\udc00":1}'.encode()


def test_keys_sort_by_utf16() -> None:
    """U+1F600 (D83D DE00 in UTF-16) sorts before U+E000, unlike by code point."""
    value = {"\ue000": 1, "😀": 2, "a": 3, "\uffff": 4}
    assert canonical_json(value) == '{"a":3,"😀":2,"\ue000":1,"\uffff":4}'.encode()


def test_utf16_equal_keys_refused() -> None:
    """A split surrogate pair and the character it encodes would be one JavaScript key."""
    assert "UTF-16" in str(refusal({"😀": 1, "\ud83d\ude00": 2}).detail)


@pytest.mark.parametrize(
    "value",
    [
        [100.0, '":1.0,"', '":2.0]', 1e16, ":3e+16}"],
        {"a.0,": 1.0, "k": ['x":4.0,', "\\", 5.0]},
        ['\\":6.0,', '\\\\":7.0]', 8.0, "\\"],
    ],
)
def test_float_text_in_strings_kept(value: object) -> None:
    """Only number tokens are rewritten, never text in a string that looks like one."""
    assert fast(value) == exact(value) == canonical_json(value)
    assert json.loads(canonical_json(value)) == json.loads(json.dumps(value))


# -- structure --------------------------------------------------------------------------------


def test_shared_values_not_cycles() -> None:
    """The same list twice is fine; only a value inside itself is a cycle."""
    shared = [1.0]
    assert canonical_json({"a": shared, "b": [shared, shared]}) == b'{"a":[1],"b":[[1],[1]]}'


def test_cycles_are_refused() -> None:
    """A list or dict that contains itself cannot be encoded."""
    looped: list[Any] = [1]
    looped.append({"again": looped})
    assert "cycle" in str(refusal(looped).detail)
    mapping: dict[str, Any] = {}
    mapping["self"] = mapping
    assert "cycle" in str(refusal([mapping]).detail)


def test_max_depth_bound() -> None:
    """Deep values give a clear error at MAX_DEPTH, never a RecursionError."""
    assert canonical_json(nested_lists(MAX_DEPTH)) == b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert f"deeper than {MAX_DEPTH}" in str(refusal(nested_lists(MAX_DEPTH + 1)).detail)
    deep: dict[str, Any] = {}
    inner = deep
    for _ in range(5 * MAX_DEPTH):
        inner["k"] = inner = {}
    assert "deeper" in str(refusal(deep).detail)


def test_deep_caller_no_recursion() -> None:
    """The fast encoder recurses a little; near the stack limit the iterative one takes over."""
    value = {"deep": nested_lists(300)}

    def call_at(levels: int) -> bytes:
        return canonical_json(value) if levels <= 0 else call_at(levels - 1)

    spare = sys.getrecursionlimit() - len(inspect.stack(0)) - 40
    assert call_at(spare) == exact(value)


def test_beyond_orjson_depth() -> None:
    """orjson stops at 255 levels; the fast encoder then encodes the top levels itself."""
    value = {"wide": list(range(50)), "deep": nested_lists(300), "f": [2.0]}
    assert fast(value) == exact(value)


def test_deep_odd_values_in_place() -> None:
    """Only the subtree orjson refuses is taken apart; the result is the exact encoding."""
    records: list[dict[str, Any]] = [{"id": n, "name": f"r{n}", "score": n / 4} for n in range(500)]
    records[321]["name"] = "bad \udc80 text"
    records[400]["id"] = 2**60
    assert fast(records) == exact(records)


def test_large_objects_key_order() -> None:
    """A refused object of many keys is encoded in groups; the keys stay in UTF-16 order."""
    value: dict[str, Any] = {f"k{n:03d}{chr(0xE000 + n)}": [n, 1.0] for n in range(200)}
    value.update({f"k{n:03d}😀": n for n in range(0, 200, 7)})
    value["k150\ue096"] = ["lone \udfff", 2**70]
    assert fast(value) == exact(value)


def test_deep_utf16_order() -> None:
    """Astral and U+E000..U+FFFF text anywhere makes the fast encoder check key order."""
    records = [{"\ue001": n, "😀": "x", "n": "\ufb01"} for n in range(300)]
    assert fast(records) == exact(records)
    assert fast(records).startswith('[{"n":"\ufb01","😀":"x","\ue001":0}'.encode())


def test_state_digest_is_sha256() -> None:
    """The digest is "sha256:" and 64 lowercase hex digits."""
    value = {"b": [1.5, None], "a": "é"}
    digest = state_digest(value)
    assert re.fullmatch("sha256:[0-9a-f]{64}", digest)
    assert digest == "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


# -- the two encoders -------------------------------------------------------------------------


def test_orjson_float_format() -> None:
    """If an orjson release changes its float format, the fast encoder switches itself off."""
    assert _fast._ORJSON_FLOATS_AS_EXPECTED


def test_gc_referents_members() -> None:
    """The fast encoder finds every member through gc.get_referents; it is on here (CPython)."""
    assert _fast._REFERENTS_AS_EXPECTED


@pytest.mark.parametrize(
    "value",
    [
        uuid.UUID(int=7),
        Colour.RED,
        Level.LOW,
        Mode.FAST,
        orjson.Fragment(b"1"),
        collections.OrderedDict(a=1),
        Tags(["a"]),
        Name("a"),
        Ratio(0.5),
        Point(1),
        datetime.date(2024, 2, 29),
        math.nan,
        -math.inf,
    ],
    # A Fragment's repr holds its address: the type's name keeps the ids the same in every
    # pytest-xdist worker.
    ids=lambda value: repr(value) if not isinstance(value, orjson.Fragment) else "Fragment",
)
def test_fast_encoder_refuses(value: object) -> None:
    """orjson encodes enums, UUIDs and fragments and prints NaN as null; the fast path says no."""
    records: list[Any] = [{"id": n, "score": n / 4, "tags": ["a", n]} for n in range(200)]
    records[123]["tags"].append({"deep": [value]})
    assert _outcome(fast, records) == "RUNTIME_STATE_VALUE_INVALID"
    assert _outcome(canonical_json, records) == "RUNTIME_STATE_VALUE_INVALID"


def test_mixed_special_floats() -> None:
    """Each float orjson prints unlike ECMAScript is rewritten, also all in one value."""
    value = {"a": [1e16, 2.0, -0.0, 1e-7, 3.0, 0.5], "b": "x.0,", "c": -0.0, "d": 4.0}
    assert fast(value) == exact(value)
    assert fast(value) == b'{"a":[10000000000000000,2,0,1e-7,3,0.5],"b":"x.0,","c":0,"d":4}'


def test_exact_encoder_vectors() -> None:
    """The reference encoder alone matches the JavaScript original on every vector."""
    for vector in vectors("canonical"):
        want = expected(vector)
        value = json.loads(vector["input"]["json"])
        if "throws" in want:
            with pytest.raises(StateInputInvalidError):
                exact(value)
        else:
            assert exact(value) == want["canonical"].encode(), vector["id"]


_TRICKY = '\x00\x1f\x7f"\\/:,.0123456789e+-[]{} aé\u2028\ue000\uffff😀\U0010ffff\ud800\udc00'
_TEXT = st.text(st.sampled_from(list(_TRICKY)) | st.characters(exclude_categories=()), max_size=8)
_FLOATS = st.floats() | st.sampled_from(
    [0.0, -0.0, 100.0, 1e15, 1e16, 1.5e16, 1e21, 1e-5, 1e-6, 1.5e-6, 1e-7, 5e-324, 0.1]
)
_INTS = st.integers(-(2**1030), 2**1030) | st.sampled_from([2**53, 2**53 + 1, -(2**53) - 1])
_LEAVES = st.none() | st.booleans() | _INTS | _FLOATS | _TEXT
_VALUES = st.recursive(
    _LEAVES,
    lambda children: (
        st.lists(children, max_size=6)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(_TEXT, children, max_size=6)
    ),
    max_leaves=40,
)


def _outcome(encode: Any, value: object) -> bytes | str:
    try:
        result: bytes = encode(value)
    except StateInputInvalidError as refused:
        return refused.code
    except _fast.RefusedError:  # the fast encoder leaves the verdict to the exact one
        return "RUNTIME_STATE_VALUE_INVALID"
    return result


@settings(max_examples=500, database=None)
@given(_VALUES)
def test_fast_matches_exact(value: object) -> None:
    """On random JSON values (floats, big ints, astral and surrogate text) both agree."""
    assert _outcome(canonical_json, value) == _outcome(fast, value) == _outcome(exact, value)


_NUMBER_TEXTS = st.sampled_from(
    [
        *("0", "-0", "0.0", "-0.0", "100.0", "1E2", "1e16", "1.5e16", "1e21", "1e-5", "1e-6"),
        *("5e-6", "1e-7", "0.1", "9007199254740993", "18446744073709551616", "1.7e308"),
    ]
)
_PARSED_TEXT = st.recursive(
    _NUMBER_TEXTS | _TEXT.map(json.dumps) | st.sampled_from(["true", "false", "null"]),
    lambda children: (
        st.lists(children, max_size=6).map(lambda items: "[" + ",".join(items) + "]")
        | st.dictionaries(_TEXT.map(json.dumps), children, max_size=6).map(
            lambda members: "{" + ",".join(f"{k}:{v}" for k, v in members.items()) + "}"
        )
    ),
    max_leaves=40,
)


@settings(max_examples=500, database=None)
@given(_PARSED_TEXT)
def test_parsed_fast_matches_exact(text: str) -> None:
    """On what orjson.loads returns (floats, ints, astral text), both give the same outcome."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return  # a lone surrogate or a number beyond a double: the exact parser's, never this path
    assert _outcome(canonical_json_of_parsed, value) == _outcome(canonical_json, value)


def test_parsed_vectors() -> None:
    """Every canonical vector orjson can read gives the JavaScript module's bytes."""
    read = 0
    for vector in vectors("canonical"):
        try:
            value = orjson.loads(vector["input"]["json"])
        except orjson.JSONDecodeError:
            continue
        read += 1
        want = expected(vector)
        if "throws" in want:
            with pytest.raises(StateInputInvalidError):
                canonical_json_of_parsed(value)
        else:
            assert canonical_json_of_parsed(value) == want["canonical"].encode(), vector["id"]
    assert read > 50


@pytest.mark.parametrize(
    "text",
    ['{"a":100.0}', '{"a":-0.0}', '{"a":1e16}', '{"a":5e-6}', '{"a":"1.0,","b":1.5}'],
)
def test_odd_float_tokens_slow_path(text: str) -> None:
    """An integral or exponent float (or such text in a string) is encoded by the full path."""
    value = orjson.loads(text)
    assert _fast.encode_parsed(value) is None
    assert canonical_json_of_parsed(value) == canonical_json(value)
