"""Bad control input over real sockets: a clear 4xx with a stable code, and nothing changes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from ._control import (
    AUTH,
    BEGIN,
    CONTROL_TOKEN,
    STATUS,
    WireControl,
    drain_request,
    new_nonce,
)

pytestmark = [pytest.mark.server, pytest.mark.anyio]

MAX_CONTROL_BODY = 16 * 1024


@dataclass(frozen=True)
class BadBegin:
    """One malformed begin request and what the control plane must answer."""

    status: int
    error: str
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    padding: int = 0
    raw: bytes | None = None
    chunked: bool = False
    expected_headers: dict[str, str] = field(default_factory=dict)

    def body(self, request: dict[str, Any]) -> bytes:
        if self.raw is not None:
            return self.raw
        if self.padding:
            request = {**request, "padding": "x" * self.padding}
        return orjson.dumps(request)


BAD_BEGINS = {
    "wrong-token": BadBegin(
        401,
        "RUNTIME_UNAUTHORIZED",
        headers={"Authorization": "Bearer not-the-control-token-at-all"},
        expected_headers={"www-authenticate": "Bearer"},
    ),
    "no-token": BadBegin(
        401, "RUNTIME_UNAUTHORIZED", headers={}, expected_headers={"www-authenticate": "Bearer"}
    ),
    "oversized-body": BadBegin(
        413, "RUNTIME_BODY_TOO_LARGE", headers=AUTH, padding=MAX_CONTROL_BODY
    ),
    "oversized-chunked-body": BadBegin(
        413, "RUNTIME_BODY_TOO_LARGE", headers=AUTH, padding=MAX_CONTROL_BODY, chunked=True
    ),
    "wrong-content-type": BadBegin(
        415, "RUNTIME_CONTENT_TYPE", headers=AUTH, content_type="text/plain"
    ),
    "malformed-json": BadBegin(
        400,
        "RUNTIME_DRAIN_REQUEST_INVALID",
        headers=AUTH,
        raw=b'{"protocol": "forgezero-drain/v1",',
    ),
}


@pytest.mark.parametrize("case", BAD_BEGINS.values(), ids=BAD_BEGINS.keys())
async def test_bad_begin_4xx(http: httpx.AsyncClient, control: WireControl, case: BadBegin) -> None:
    """A bad begin gets its 4xx and changes nothing: a refused begin leaves the generation serving;
    the same nonce then begins as new."""
    nonce = new_nonce()
    body = case.body(drain_request(nonce))
    content: bytes | AsyncIterator[bytes] = _chunked(body) if case.chunked else body

    response = await http.post(
        BEGIN, content=content, headers={**case.headers, "Content-Type": case.content_type}
    )

    assert response.status_code == case.status
    assert response.json()["error"] == case.error
    for name, value in case.expected_headers.items():
        assert response.headers[name] == value
    assert CONTROL_TOKEN not in response.text
    assert await control.ready() == 200
    assert (await http.get("/fast")).status_code == 200
    assert (await http.get(STATUS, params={"nonce": nonce}, headers=AUTH)).status_code == 404
    await control.begin(nonce=nonce)  # accepted, and not as a duplicate


async def _chunked(body: bytes) -> AsyncIterator[bytes]:
    """The body without Content-Length, so only the streamed byte count can catch it."""
    for start in range(0, len(body), 4096):
        yield body[start : start + 4096]
