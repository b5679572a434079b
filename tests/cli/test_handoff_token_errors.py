"""A malformed handoff token is refused without showing any part of it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import ValidationError

from forgezero_lifecycle._errors import ConfigurationError
from forgezero_lifecycle.client import handoff_request
from forgezero_lifecycle.wire.handoff import StateHandoffRequest, StateSource

TOKEN = "Zq9XkW7pLm2VbN4cRt8YhJ3dFg6SaQ1wEo5UiK0zXy!!"  # 44 characters, two not base64url


def pieces(token: str, size: int = 6) -> list[str]:
    return [token[i : i + size] for i in range(len(token) - size + 1)]


def assert_hidden(text: str) -> None:
    leaked = [piece for piece in pieces(TOKEN) if piece in text]
    assert not leaked, leaked


def test_token_not_echoed() -> None:
    """handoff_request() refuses the token without echoing it: it names the rule, not the token."""
    with pytest.raises(ConfigurationError, match="43 base64url") as caught:
        handoff_request(
            protocol="tests.note",
            schema_version=1,
            source_revision="a" * 40,
            target_revision="b" * 40,
            source_url="http://127.0.0.1:8000/x",
            handoff_token=TOKEN,
        )
    assert_hidden(str(caught.value))
    assert_hidden(repr(caught.value))


@pytest.mark.parametrize(
    "build",
    [
        lambda: StateSource(url="http://127.0.0.1/", authorization=f"Bearer {TOKEN}"),
        lambda: StateHandoffRequest.model_validate(
            {
                "protocol": "tests.note",
                "nonce": "N" * 43,
                "schemaVersion": 1,
                "sourceRevision": "a" * 40,
                "targetRevision": "b" * 40,
                "source": {"url": "http://127.0.0.1/", "authorization": f"Bearer {TOKEN}"},
            }
        ),
    ],
)
def test_models_hide_authorization(build: Callable[[], object]) -> None:
    """Wire models never show a refused authorization: str() and repr() of the validation error
    carry no input_value."""
    with pytest.raises(ValidationError) as caught:
        build()
    assert_hidden(str(caught.value))
    assert_hidden(repr(caught.value))
