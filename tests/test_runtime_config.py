"""A Runtime that could never drain, hand over or close cleanly is refused when it is built."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from forgezero_lifecycle._errors import ConfigurationError
from forgezero_lifecycle.runtime import Runtime

pytestmark = pytest.mark.anyio

TOKEN = "runtime-config-token-0123456789"
HANDOFF = "runtime-config-handoff-token-0123456789abcd"
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("revision", ["1111111", "A" * 40, "a" * 39, "a" * 41, "a" * 40 + "\n", ""])
def test_unnameable_revision_refused(revision: str) -> None:
    """Only a full 40-hex commit can ever equal a drain's sourceRevision."""
    with pytest.raises(ConfigurationError, match="40-hex"):
        Runtime(control_token=TOKEN, revision=revision)


def test_a_full_revision_is_accepted() -> None:
    """The accepted form: 40 lowercase hex digits."""
    assert Runtime(control_token=TOKEN, revision="0a" * 20).revision == "0a" * 20


@pytest.mark.parametrize(
    "handoff_token",
    ["h" * 16, "h" * 42, "h" * 44, "h" * 42 + "=", "h" * 42 + "+", "h" * 42 + "é"],
)
def test_bad_handoff_token_refused(handoff_token: str) -> None:
    """source.authorization carries exactly 43 base64url characters, so nothing else works."""
    with pytest.raises(ConfigurationError, match="43 base64url") as caught:
        Runtime(control_token=TOKEN, handoff_token=handoff_token)
    assert handoff_token not in str(caught.value)


def test_shared_token_refused() -> None:
    """The handoff token reaches the new generation; the control token must not."""
    with pytest.raises(ConfigurationError, match="differ"):
        Runtime(control_token=HANDOFF, handoff_token=HANDOFF)
    Runtime(control_token=TOKEN, handoff_token=HANDOFF)


@pytest.mark.parametrize("token", ["short", "x" * 20 + " y", "tökentökentökentöken", "a\nb" * 10])
def test_bad_control_token_refused(token: str) -> None:
    """Too short, whitespace or non-ASCII: refused, and the message never echoes it."""
    with pytest.raises(ConfigurationError) as caught:
        Runtime(control_token=token)
    assert token not in str(caught.value)


def test_k8s_placeholders_refused() -> None:
    """An unedited example Secret fails at start-up, saying it is a placeholder."""
    text = (ROOT / "examples/kubernetes/deployment.yaml").read_text()
    control = re.search(r'control-token: "([^"]*)"', text)
    handoff = re.search(r'handoff-token: "([^"]*)"', text)
    assert control is not None
    assert handoff is not None
    with pytest.raises(ConfigurationError, match="placeholder"):
        Runtime(control_token=control.group(1))
    with pytest.raises(ConfigurationError, match="placeholder"):
        Runtime(control_token=TOKEN, handoff_token=handoff.group(1))


@pytest.mark.parametrize("code", [1004, 1005, 1006, 1015, 1016, 2999, 999, 5000, True])
def test_unsendable_close_refused(code: int) -> None:
    """RFC 6455 §7.4: 1005, 1006, 1015 and the reserved ranges never go on the wire."""
    with pytest.raises(ConfigurationError, match="may not be sent"):
        Runtime(control_token=TOKEN, websocket_close_code=code)


@pytest.mark.parametrize("code", [1000, 1001, 1011, 1012, 1014, 3000, 4999])
def test_sendable_close_accepted(code: int) -> None:
    """Every code an endpoint may send is accepted."""
    Runtime(control_token=TOKEN, websocket_close_code=code)


@pytest.mark.parametrize("retry_after", [-1, 1.5, "1", True])
def test_fractional_retry_refused(retry_after: Any) -> None:
    """Retry-After is a count of seconds ≥ 0."""
    with pytest.raises(ConfigurationError, match="retry_after"):
        Runtime(control_token=TOKEN, retry_after=retry_after)


async def test_retry_after_via_runtime() -> None:
    """The refusal's Retry-After header says what the runtime was given."""
    runtime = Runtime(control_token=TOKEN, retry_after=7)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("a refused request never reaches the app")

    runtime.gate.begin_draining()
    runtime.gate.close()
    transport = httpx.ASGITransport(app=runtime.wrap(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        response = await http.get("/")
    assert (response.status_code, response.headers["retry-after"]) == (503, "7")
