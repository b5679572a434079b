"""A small client of the control protocol for the real-server tests, with bounded polling.

It is deliberately written against the wire (paths, JSON bodies, headers), not against the
library's own client (``forgezero_lifecycle.client.ControlClient``, hence a name of its own), so
the tests check what any orchestrator would see.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import httpx

__all__ = [
    "CONTROL_TOKEN",
    "SOURCE_REVISION",
    "STREAM_GRACE",
    "TARGET_REVISION",
    "WireControl",
    "drain_request",
    "new_nonce",
]

CONTROL_TOKEN: Final = "server-tests-control-token-0123456789"
SOURCE_REVISION: Final = hashlib.sha1(b"forgezero generation one").hexdigest()
TARGET_REVISION: Final = hashlib.sha1(b"forgezero generation two").hexdigest()
#: Seconds the test app waits before it ends open streams and WebSockets.
STREAM_GRACE: Final = 0.5
#: Upper bound of every poll: far above what any scenario needs, far below the test timeout.
POLL_BOUND: Final = 15.0
POLL_INTERVAL: Final = 0.02

PREFIX: Final = "/.forgezero/runtime"
BEGIN: Final = PREFIX + "/drain/v1/begin"
STATUS: Final = PREFIX + "/drain/v1/status"
ROLLBACK: Final = PREFIX + "/drain/v1/rollback"
READY: Final = PREFIX + "/ready"
COUNTERS: Final = "/_test/counters"

AUTH: Final = {"Authorization": f"Bearer {CONTROL_TOKEN}"}


def new_nonce() -> str:
    return secrets.token_urlsafe(32)


def drain_request(nonce: str, timeout_ms: int = 5000) -> dict[str, Any]:
    return {
        "protocol": "forgezero-drain/v1",
        "nonce": nonce,
        "sourceRevision": SOURCE_REVISION,
        "targetRevision": TARGET_REVISION,
        "timeoutMs": timeout_ms,
    }


class WireControl:
    """Begin, observe and roll back drains of one server; remembers what it began."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.nonces: list[str] = []

    async def begin(self, timeout_ms: int = 5000, *, nonce: str | None = None) -> str:
        """Begin a drain and check it was accepted as new; returns its nonce."""
        nonce = nonce or new_nonce()
        self.nonces.append(nonce)
        response = await self.http.post(BEGIN, json=drain_request(nonce, timeout_ms), headers=AUTH)
        assert response.status_code == 202, response.text
        assert response.json() == {"accepted": True, "duplicate": False}
        return nonce

    async def status(self, nonce: str) -> dict[str, Any]:
        response = await self.http.get(STATUS, params={"nonce": nonce}, headers=AUTH)
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    async def rollback(self, nonce: str) -> httpx.Response:
        return await self.http.post(ROLLBACK, json={"nonce": nonce}, headers=AUTH)

    async def ready(self) -> int:
        return (await self.http.get(READY)).status_code

    async def counters(self) -> dict[str, int]:
        """In-flight counts from the test app's exempt endpoint (works with or without a drain)."""
        response = await self.http.get(COUNTERS)
        assert response.status_code == 200, response.text
        result: dict[str, int] = response.json()
        return result

    async def wait_for_status(self, nonce: str, *states: str) -> dict[str, Any]:
        """Poll until the drain reaches one of ``states``; fail after a bounded time."""
        return await _poll(lambda: self.status(nonce), lambda s: s["status"] in states)

    async def wait_for_counters(self, done: Callable[[dict[str, int]], bool]) -> dict[str, int]:
        return await _poll(self.counters, done)

    async def wait_admitted(self, kind: str = "http", count: int = 1) -> None:
        """Wait until ``count`` units of ``kind`` are in flight, so a drain cannot refuse them."""
        await self.wait_for_counters(lambda counters: counters[kind] >= count)

    async def reset(self) -> None:
        """Roll back whatever this test began and wait until the server is serving and idle."""
        for nonce in self.nonces:
            response = await self.rollback(nonce)
            assert response.status_code in (200, 404), response.text
        if self.nonces:  # a rolled-back drain still reports the live counters
            await _poll(
                lambda: self.status(self.nonces[-1]),
                lambda status: not any(status["inFlight"].values()),
            )
        assert await self.ready() == 200


T = TypeVar("T")


async def _poll(fetch: Callable[[], Awaitable[T]], done: Callable[[T], bool]) -> T:
    deadline = time.monotonic() + POLL_BOUND
    while True:
        value = await fetch()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still {value!r} after {POLL_BOUND} s")
        await asyncio.sleep(POLL_INTERVAL)
