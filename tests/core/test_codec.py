"""StateCodec's collector setting: the collector left alone by default, paused when asked.

The tests touch the process's collector on purpose (tests/core/_collector.py says what they read).
"""

from __future__ import annotations

import gc
from typing import ClassVar

import orjson
import pytest
from pydantic import BaseModel, model_validator

from forgezero_lifecycle._canonical import canonical_json, digest_of
from forgezero_lifecycle.core._codec import StateCodec
from forgezero_lifecycle.wire.handoff import StateHandoffRequest
from tests.core._collector import in_young_generation, nothing_frozen

SRC = "0123456789abcdef0123456789abcdef01234567"
TGT = "fedcba9876543210fedcba9876543210fedcba98"


class Row(BaseModel):
    name: str
    tags: list[str]


class Table(BaseModel):
    rows: list[Row]
    #: Whether the collector was enabled at each validation of a Table.
    collector_seen: ClassVar[list[bool]] = []

    @model_validator(mode="after")
    def _recorded(self) -> Table:
        Table.collector_seen.append(gc.isenabled())
        return self


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
def test_default_leaves_collector() -> None:
    """Without the setting, opening validates with the collector on and freezes nothing."""
    Table.collector_seen.clear()
    frozen = gc.get_freeze_count()  # not 0 on every version: 3.12 starts with some frozen
    value, context = StateCodec.of(Adapter()).open_body(request(), body())
    assert Table.collector_seen == [True]
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
    assert context.cursor == "c-1"
    assert len(value.rows) == 2000


@pytest.mark.usefixtures("collector_enabled")
def test_paused_open_ages_value() -> None:
    """With the setting, the step runs with the collector paused, and the typed value, which
    outlives it, is no longer young: the next young collection does not scan its containers."""
    Table.collector_seen.clear()
    codec = StateCodec.of(Adapter(), pause_collector=True)
    nothing_frozen()
    value, _ = codec.open_body(request(), body())
    assert Table.collector_seen == [False]
    assert gc.isenabled()
    assert not in_young_generation(value)
    assert not in_young_generation(value.rows[-1])


@pytest.mark.usefixtures("collector_enabled")
def test_frozen_objects_stay_frozen() -> None:
    """An app that froze its objects (gc.freeze, before a fork) keeps them frozen under a
    paused open: the value is then left to the collector as it is."""
    codec = StateCodec.of(Adapter(), pause_collector=True)
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        value, _ = codec.open_body(request(), body())
        assert gc.get_freeze_count() == frozen
        assert len(value.rows) == 2000
    finally:
        gc.unfreeze()


def test_disabled_collector_stays() -> None:
    """A paused open_body leaves a collector the app disabled as it found it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        codec = StateCodec.of(Adapter(), pause_collector=True)
        value, _ = codec.open_body(request(), body())
        assert not gc.isenabled()
        assert len(value.rows) == 2000
    finally:
        if enabled:
            gc.enable()
