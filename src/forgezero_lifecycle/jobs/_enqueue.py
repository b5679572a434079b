"""What every store does before it writes an enqueue: refuse bad input, encode, hash.

The checks and limits are the same for every store (README, "Durable fenced jobs"), so a
deterministic input error is always ``JOB_INVALID`` and never reaches a database, where it
could look like ``JOB_STORE_UNAVAILABLE``, a retryable error. Also here: the row a store has
just inserted (built from the insert's own arguments) and the listeners an enqueue wakes.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

import orjson

from .._errors import JobInvalidError
from .store import Job

__all__ = [
    "MAX_ATTEMPTS",
    "MAX_DELAY_SECONDS",
    "MAX_IDEMPOTENCY_KEY_BYTES",
    "MAX_PAYLOAD_BYTES",
    "MAX_PAYLOAD_DEPTH",
    "MAX_QUEUE_NAME_BYTES",
    "Enqueue",
    "Listeners",
    "check_enqueue",
    "check_json_data",
    "is_plain_json",
    "new_key",
    "payload_hash",
    "payload_json",
    "prepare_enqueue",
    "prepare_enqueue_many",
    "queued_job",
]

#: A payload's compact JSON: a job carries a reference to big data, not the data.
MAX_PAYLOAD_BYTES: Final = 1_048_576
#: Containers nested in a payload, the payload itself counted: what orjson encodes. The walks
#: below stop there too, so a payload that holds itself is refused instead of walked forever.
MAX_PAYLOAD_DEPTH: Final = 254
#: An idempotency key's UTF-8 (PostgreSQL's unique index refuses entries past ~2700 bytes).
MAX_IDEMPOTENCY_KEY_BYTES: Final = 1024
MAX_QUEUE_NAME_BYTES: Final = 256
#: Ten years: beyond it a delay is a mistake (``inf`` would park a job forever).
MAX_DELAY_SECONDS: Final = 315_576_000
#: PostgreSQL's ``integer`` column.
MAX_ATTEMPTS: Final = 2**31 - 1


@final
class Listeners:
    """The callbacks a store wakes on every enqueue through it (the worker's early wake-up)."""

    __slots__ = ("_callbacks",)

    def __init__(self) -> None:
        self._callbacks: list[Callable[[], None]] = []

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Add ``callback``; the returned function removes it (safe to call twice)."""
        self._callbacks.append(callback)

        def unsubscribe() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return unsubscribe

    def notify(self) -> None:
        for callback in list(self._callbacks):
            callback()


def payload_json(payload: Mapping[str, Any]) -> str:
    """The payload as compact JSON with sorted keys (what stores persist).

    Only JSON data passes (see :func:`check_json_data`), at most :data:`MAX_PAYLOAD_BYTES`.
    """
    if not isinstance(payload, Mapping):
        raise JobInvalidError(
            detail=f"a job payload must be a mapping, not {type(payload).__name__}"
        )
    # A dict is encoded as it is (nothing runs between the check and the encoding); any
    # other mapping is copied into one, which is all orjson encodes.
    data = payload if type(payload) is dict else dict(payload)
    if not _plain_json(data):
        check_json_data(data)
    try:
        text = orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as error:
        raise JobInvalidError(detail=f"a job payload must be JSON data: {error}") from None
    if len(text) > MAX_PAYLOAD_BYTES:
        raise JobInvalidError(
            detail=f"a job payload is at most {MAX_PAYLOAD_BYTES} bytes of JSON, got {len(text)}; "
            "store large data elsewhere and enqueue a reference to it"
        )
    return text.decode()


def check_json_data(data: object, what: str = "payload") -> None:
    """Refuse what JSON cannot carry exactly, or one of the stores cannot keep.

    JSON data is ``dict`` (``str`` keys), ``list``/``tuple``, ``str``, ``int``, finite
    ``float``, ``bool`` and ``None``. Refused, before anything is written: ``NaN`` and
    ``Infinity`` (JSON has no such numbers, orjson would write ``null``), every other type
    (``datetime``, ``UUID``, dataclasses, ``Decimal``, ``bytes``, sets... which a serialiser
    would silently turn into something else) and strings with NUL (PostgreSQL's ``jsonb`` cannot
    hold ``\\u0000``), and containers nested deeper than :data:`MAX_PAYLOAD_DEPTH` (a payload that
    holds itself among them). Lone surrogates and integers beyond 64 bits are refused by the
    encoder. ``what`` names the value in the messages (``payload``, ``result``).
    """
    pending: list[tuple[object, str, int]] = [(data, what, 1)]
    while pending:
        value, where, depth = pending.pop()
        if value is None or isinstance(value, bool | int):
            continue
        if depth > MAX_PAYLOAD_DEPTH and isinstance(value, dict | list | tuple):
            raise JobInvalidError(
                detail=f"{where} is nested deeper than {MAX_PAYLOAD_DEPTH} containers, or "
                f"the {what} holds itself"
            )
        if isinstance(value, str):
            if "\x00" in value:
                raise JobInvalidError(
                    detail=f"{where} holds a NUL character, which jobs cannot store"
                )
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise JobInvalidError(detail=f"{where} is {value!r}, which JSON cannot carry")
        elif isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise JobInvalidError(
                        detail=f"{where} has a {type(key).__name__} key; JSON keys are str"
                    )
                if "\x00" in key:
                    raise JobInvalidError(detail=f"{where} has a key with a NUL character")
                pending.append((item, f"{where}[{key[:40]!r}]", depth + 1))
        elif isinstance(value, list | tuple):
            pending.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))
        else:
            raise JobInvalidError(
                detail=f"{where} is a {type(value).__name__}, not JSON data; convert it first "
                "(str(uuid), datetime.isoformat(), dataclasses.asdict(...))"
            )


def is_plain_json(value: object) -> bool:
    """:func:`_plain_json` for any value, a container or not (a job's result)."""
    if type(value) is dict or type(value) is list or type(value) is tuple:
        return _plain_json(value)
    return _plain_json([value])  # a scalar: one list around it adds no container it counts


def _plain_json(data: dict[str, Any] | list[Any] | tuple[Any, ...]) -> bool:
    """True when ``data`` holds only exact JSON types that :func:`check_json_data` accepts.

    The fast path of every enqueue: no paths are formatted and subclasses are not looked at.
    False only means "ask :func:`check_json_data`", which accepts subclasses or names the
    fault, so the two together refuse exactly what :func:`check_json_data` refuses.
    """
    containers: list[tuple[Any, int]] = [(data, 1)]
    while containers:
        container, depth = containers.pop()
        if depth > MAX_PAYLOAD_DEPTH:
            return False
        if type(container) is dict:
            for key in container:
                if type(key) is not str or "\x00" in key:
                    return False
            items = container.values()
        else:
            items = container
        for item in items:
            kind = type(item)
            if kind is str:
                if "\x00" in item:
                    return False
            elif kind is int or kind is bool or item is None:
                continue
            elif kind is float:
                if not math.isfinite(item):
                    return False
            elif kind is dict or kind is list or kind is tuple:
                containers.append((item, depth + 1))
            else:
                return False
    return True


def payload_hash(queue: str, payload_text: str) -> str:
    """The digest that tells a reused idempotency key from a repeated enqueue."""
    return hashlib.sha256(f"{queue}\x00{payload_text}".encode()).hexdigest()


def new_key() -> str:
    """An idempotency key for a job enqueued without one: 128 random bits in hex.

    ``os.urandom`` and not ``uuid.uuid4().hex``: the same 32 hex characters (six more random
    bits) in a fifth of the time, which an enqueue without a key pays once per job.
    """
    return f"auto:{os.urandom(16).hex()}"


@final
@dataclass(frozen=True, slots=True)
class Enqueue:
    """An enqueue's arguments checked and encoded, ready for any store to write."""

    payload_text: str
    payload_digest: str
    idempotency_key: str


def queued_job(
    job_id: int,
    queue: str,
    payload: dict[str, Any],
    idempotency_key: str,
    max_attempts: int,
    run_after: float,
) -> Job:
    """The row a store has just inserted, from what the insert wrote (no read of it back).

    Positional, in :class:`Job`'s field order: thirteen keywords took twice as long to bind,
    once per enqueue.
    """
    # id, queue, payload, idempotency_key, state, attempts, max_attempts, run_after, fence,
    # lease_owner, lease_until, last_error, result
    return Job(
        job_id, queue, payload, idempotency_key, "queued", 0, max_attempts, run_after, 0,
        None, None, None, None,
    )  # fmt: skip


def prepare_enqueue(
    queue: str,
    payload: Mapping[str, Any],
    idempotency_key: str | None,
    delay: float,
    max_attempts: int,
) -> Enqueue:
    """What every store does first: refuse bad arguments (JobInvalidError), encode and hash.

    The checks are the same for every store, so a deterministic input error is always
    ``JOB_INVALID`` and never reaches a database (where it could look like
    ``JOB_STORE_UNAVAILABLE``, a retryable error).
    """
    check_enqueue(queue, delay, max_attempts)
    return _prepare_item(queue, payload, idempotency_key)


def _prepare_item(queue: str, payload: Mapping[str, Any], idempotency_key: str | None) -> Enqueue:
    """The per-job part of :func:`prepare_enqueue` (its queue, delay and attempts checked)."""
    if idempotency_key is not None:
        _check_text(idempotency_key, "idempotency_key", MAX_IDEMPOTENCY_KEY_BYTES)
    text = payload_json(payload)
    key = new_key() if idempotency_key is None else idempotency_key
    return Enqueue(text, payload_hash(queue, text), key)


def prepare_enqueue_many(
    queue: str,
    payloads: Sequence[Mapping[str, Any]],
    idempotency_keys: Sequence[str | None] | None,
    delay: float,
    max_attempts: int,
) -> list[Enqueue]:
    """``enqueue_many``'s preamble: :func:`prepare_enqueue` for every item, before any write.

    The queue, delay and attempts are the batch's, checked once (they would fail on the first
    item or not at all).
    """
    if isinstance(payloads, Mapping | str | bytes) or not isinstance(payloads, Sequence):
        raise JobInvalidError(
            detail=f"enqueue_many takes a sequence of payloads, not {type(payloads).__name__}"
        )
    keys: Sequence[str | None] = (
        [None] * len(payloads) if idempotency_keys is None else idempotency_keys
    )
    if isinstance(keys, str) or len(keys) != len(payloads):
        raise JobInvalidError(detail="idempotency_keys must be a sequence as long as payloads")
    check_enqueue(queue, delay, max_attempts)
    return [_prepare_item(queue, payload, key) for payload, key in zip(payloads, keys, strict=True)]


def check_enqueue(queue: str, delay: float, max_attempts: int) -> None:
    """Reject malformed enqueue arguments before touching the store."""
    if not isinstance(queue, str) or not queue:
        raise JobInvalidError(detail="a job needs a non-empty queue (handler) name")
    _check_text(queue, "the queue name", MAX_QUEUE_NAME_BYTES)
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        raise JobInvalidError(
            detail=f"delay must be a number of seconds, not {type(delay).__name__}"
        )
    if not 0 <= delay <= MAX_DELAY_SECONDS:
        raise JobInvalidError(
            detail=f"delay must be between 0 and {MAX_DELAY_SECONDS} seconds (10 years), "
            f"got {delay!r}"
        )
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        raise JobInvalidError(
            detail=f"max_attempts must be an int, not {type(max_attempts).__name__}"
        )
    if not 1 <= max_attempts <= MAX_ATTEMPTS:
        raise JobInvalidError(
            detail=f"max_attempts must be 1 to {MAX_ATTEMPTS}, got {max_attempts!r}"
        )


def _check_text(text: object, what: str, limit: int) -> None:
    """A name or key every store can index: a str, valid UTF-8, no NUL, at most ``limit`` bytes."""
    if not isinstance(text, str) or not text:
        raise JobInvalidError(detail=f"{what} must be a non-empty str")
    if "\x00" in text:
        raise JobInvalidError(detail=f"{what} holds a NUL character")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise JobInvalidError(
            detail=f"{what} holds a lone surrogate (not valid Unicode text)"
        ) from None
    if size > limit:
        raise JobInvalidError(detail=f"{what} is at most {limit} bytes of UTF-8, got {size}")
