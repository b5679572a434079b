"""StateCodec's collector handling: what opening a large envelope leaves to the collector."""

from __future__ import annotations

import gc

import orjson
import pytest
from pydantic import BaseModel

from forgezero_lifecycle._canonical import canonical_json, digest_of
from forgezero_lifecycle.core._codec import StateCodec
from forgezero_lifecycle.wire.handoff import StateHandoffRequest
from tests.core._collector import in_oldest_generation

SRC = "0123456789abcdef0123456789abcdef01234567"
TGT = "fedcba9876543210fedcba9876543210fedcba98"


class Row(BaseModel):
    name: str
    tags: list[str]


class Table(BaseModel):
    rows: list[Row]


class Adapter:
    protocol = "demo.table"
    schema_version = 1
    maximum_bytes = 1_048_576
    model = Table


def body() -> bytes:
    value = {"rows": [{"name": f"row-{i}", "tags": ["a", "b"]} for i in range(2000)]}
    unsigned = {
        "protocol": "demo.table",
        "schemaVersion": 1,
        "sourceRevision": SRC,
        "targetRevision": TGT,
        "cursor": "c-1",
        "value": value,
    }
    return orjson.dumps({**unsigned, "digest": digest_of(canonical_json(unsigned))})


def request() -> StateHandoffRequest:
    return StateHandoffRequest.model_validate(
        {
            "protocol": "demo.table",
            "nonce": "A" * 43,
            "schemaVersion": 1,
            "sourceRevision": SRC,
            "targetRevision": TGT,
            "source": {"url": "http://127.0.0.1:1/x", "authorization": "Bearer " + "B" * 43},
        }
    )


@pytest.mark.usefixtures("collector_enabled")
def test_an_opened_value_is_handed_to_the_oldest_generation_unscanned() -> None:
    """The typed value outlives the collector-paused step: it goes to the oldest generation at
    once, so the young collection that would follow does not scan its many containers."""
    codec = StateCodec.of(Adapter())
    value, context = codec.open_body(request(), body())
    assert in_oldest_generation(value)
    assert in_oldest_generation(value.rows[-1])
    assert gc.isenabled()
    assert context.cursor == "c-1"


@pytest.mark.usefixtures("collector_enabled")
def test_objects_the_app_froze_stay_frozen() -> None:
    """An app that froze its objects (gc.freeze, before a fork) keeps them frozen: the value
    is then left to the collector as it is."""
    codec = StateCodec.of(Adapter())
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        value, _ = codec.open_body(request(), body())
        assert gc.get_freeze_count() == frozen
        assert len(value.rows) == 2000
    finally:
        gc.unfreeze()


def test_a_disabled_collector_stays_disabled() -> None:
    """open_body leaves a collector the app disabled as it found it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        value, _ = StateCodec.of(Adapter()).open_body(request(), body())
        assert not gc.isenabled()
        assert len(value.rows) == 2000
    finally:
        if enabled:
            gc.enable()
