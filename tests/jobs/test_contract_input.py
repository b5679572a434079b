"""JobStore contract, input: every store refuses the same bad enqueue, JOB_INVALID, writing nothing.

A deterministic input error must never look retryable (``JOB_STORE_UNAVAILABLE``) or be stored
as something else (``NaN`` as ``null``, a ``datetime`` as a string).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import uuid
from typing import Any

import pytest

from forgezero_lifecycle._errors import JobInvalidError
from forgezero_lifecycle.jobs._enqueue import (
    MAX_DELAY_SECONDS,
    MAX_IDEMPOTENCY_KEY_BYTES,
    MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_DEPTH,
    MAX_QUEUE_NAME_BYTES,
)

from .conftest import StoreKit

pytestmark = pytest.mark.anyio


@dataclasses.dataclass
class Order:
    id: int


def _holding_itself() -> dict[str, Any]:
    payload: dict[str, Any] = {}
    payload["self"] = payload
    return payload


def _list_holding_itself_twice() -> dict[str, Any]:
    loop: list[Any] = []
    loop += [loop, loop]  # a walk that follows both doubles its work per level
    return {"x": loop}


def _nested(containers: int) -> dict[str, Any]:
    """A payload of ``containers`` nested containers: the payload itself, then lists."""
    value: Any = 1
    for _ in range(containers - 1):
        value = [value]
    return {"x": value}


BAD_PAYLOADS: dict[str, Any] = {
    "nan": {"x": float("nan")},
    "infinity": {"x": float("inf")},
    "minus-infinity-nested": {"x": [1, {"y": float("-inf")}]},
    "datetime": {"when": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)},
    "date": {"when": datetime.date(2026, 1, 1)},
    "uuid": {"id": uuid.uuid4()},
    "dataclass": {"order": Order(1)},
    "decimal": {"amount": decimal.Decimal("1.10")},
    "bytes": {"raw": b"abc"},
    "set": {"tags": {1, 2}},
    "int-key": {"x": {1: "one"}},
    "nul-in-value": {"x": "a\x00b"},
    "nul-in-key": {"a\x00b": 1},
    "lone-surrogate": {"x": "\ud800"},
    "too-large": {"blob": "x" * MAX_PAYLOAD_BYTES},
    "holds-itself": _holding_itself(),
    "list-holds-itself-twice": _list_holding_itself_twice(),
    "too-deep": _nested(MAX_PAYLOAD_DEPTH + 1),
}

BAD_OPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "delay-inf": ("q", {"delay": float("inf")}),
    "delay-nan": ("q", {"delay": float("nan")}),
    "delay-negative": ("q", {"delay": -0.5}),
    "delay-beyond-ten-years": ("q", {"delay": MAX_DELAY_SECONDS + 1}),
    "delay-str": ("q", {"delay": "5"}),
    "max-attempts-float": ("q", {"max_attempts": 2.5}),
    "max-attempts-beyond-int4": ("q", {"max_attempts": 2**31}),
    "key-too-long": ("q", {"idempotency_key": "k" * (MAX_IDEMPOTENCY_KEY_BYTES + 1)}),
    "key-3-mb": ("q", {"idempotency_key": "k" * 3_000_000}),
    "key-nul": ("q", {"idempotency_key": "a\x00b"}),
    "key-lone-surrogate": ("q", {"idempotency_key": "a\udc00"}),
    "key-empty": ("q", {"idempotency_key": ""}),
    "key-not-str": ("q", {"idempotency_key": 42}),
    "queue-nul": ("e\x00mail", {}),
    "queue-lone-surrogate": ("e\ud800", {}),
    "queue-too-long": ("q" * (MAX_QUEUE_NAME_BYTES + 1), {}),
}


async def assert_refused(kit: StoreKit, queue: str, payload: Any, **options: Any) -> str:
    with pytest.raises(JobInvalidError) as caught:
        await kit.store.enqueue(queue, payload, **options)
    assert caught.value.code == "JOB_INVALID"
    assert caught.value.detail
    assert (await kit.store.statistics()).total == 0
    return caught.value.detail


@pytest.mark.parametrize("case", list(BAD_PAYLOADS))
async def test_non_json_payload_refused(kit: StoreKit, case: str) -> None:
    """NaN, Infinity, non-JSON types, NUL, lone surrogates, oversize, too deep or holding itself:
    JOB_INVALID, nothing written."""
    await assert_refused(kit, "q", BAD_PAYLOADS[case], idempotency_key=f"k-{case}")


@pytest.mark.parametrize("case", list(BAD_OPTIONS))
async def test_bad_fields_refused(kit: StoreKit, case: str) -> None:
    """A bad name, key, delay or attempt count is refused: names and keys every store can
    index, finite bounded delays, int4 attempts."""
    queue, options = BAD_OPTIONS[case]
    await assert_refused(kit, queue, {"n": 1}, **options)


async def test_limits_are_accepted(kit: StoreKit) -> None:
    """Exactly at each bound the job is written, and reads back as given."""
    key = "é" * (MAX_IDEMPOTENCY_KEY_BYTES // 2)
    overhead = len('{"blob":"","t":[1,2.5,null]}')
    payload = {"blob": "x" * (MAX_PAYLOAD_BYTES - overhead), "t": (1, 2.5, None)}
    job = await kit.store.enqueue(
        "q" * MAX_QUEUE_NAME_BYTES, payload, idempotency_key=key, delay=MAX_DELAY_SECONDS
    )
    again = await kit.store.get(job.id)
    assert again is not None
    assert again.idempotency_key == key
    assert again.payload["t"] == [1, 2.5, None]
    assert len(again.payload["blob"]) == len(payload["blob"])
    deepest = await kit.store.enqueue("q", _nested(MAX_PAYLOAD_DEPTH))
    assert await kit.store.get(deepest.id) == deepest


async def test_message_names_value(kit: StoreKit) -> None:
    """The detail says where the problem is and what to do."""
    detail = await assert_refused(kit, "q", {"order": {"when": datetime.date(2026, 1, 1)}})
    assert "payload['order']['when']" in detail
    assert "date" in detail
    nan = await assert_refused(kit, "q", {"x": float("nan")})
    assert "nan" in nan
