"""Every canonical vector of the conformance file, run against :func:`canonical_json`.

The value is ``json.loads`` of the vector's text (which accepts the NaN and Infinity tokens a few
vectors use); the envelope is what ``exportState`` digests: the vector's envelope plus the value.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from forgezero_lifecycle._canonical import canonical_json, state_digest
from forgezero_lifecycle._errors import StateInputInvalidError

from ._vectors import counts, expected, vectors

CANONICAL = vectors("canonical")


def test_all_vectors_collected() -> None:
    """The parametrized test below runs exactly the vectors the file announces."""
    assert len(CANONICAL) == counts()["canonical"] == 101


@pytest.mark.parametrize("vector", CANONICAL, ids=[v["id"] for v in CANONICAL])
def test_canonical_vector(vector: dict[str, Any]) -> None:
    """canonical_json and state_digest give the bytes and digests the JavaScript module gave."""
    want = expected(vector)
    value = json.loads(vector["input"]["json"])
    envelope = {**vector["input"]["envelope"], "value": value}
    if "throws" in want:
        for refused in (value, envelope):
            with pytest.raises(StateInputInvalidError) as caught:
                canonical_json(refused)
            assert caught.value.code == want["throws"]["code"] == "RUNTIME_STATE_VALUE_INVALID"
        return
    encoded = canonical_json(value)
    assert encoded == want["canonical"].encode()
    assert len(encoded) == want["canonical_utf8_bytes"]
    assert hashlib.sha256(encoded).hexdigest() == want["value_sha256"]
    assert state_digest(value) == "sha256:" + want["value_sha256"]
    sealed = canonical_json(envelope)
    assert sealed == want["envelope_canonical"].encode()
    assert len(sealed) == want["envelope_canonical_utf8_bytes"]
    assert state_digest(envelope) == want["envelope_digest"]
