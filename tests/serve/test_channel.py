"""The private channel: length-prefixed orjson requests, answers and events on a socket pair."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from forgezero_lifecycle.serve.channel import (
    Channel,
    ChannelClosedError,
    encode,
    read_frame_blocking,
)

pytestmark = pytest.mark.anyio


async def test_requests_are_answered_and_events_arrive_both_ways() -> None:
    left, right = socket.socketpair()
    seen: list[dict[str, Any]] = []

    async def echo(message: dict[str, Any]) -> dict[str, Any] | None:
        seen.append(message)
        return None if "event" in message else {"echo": message.get("value")}

    one = await Channel.open(left, echo)
    other = await Channel.open(right, echo)
    try:
        assert (await one.request("ping", value="é" * 3))["echo"] == "é" * 3
        assert (await other.request("ping", value=7))["echo"] == 7
        one.notify({"event": "state", "state": "ready"})
        assert (await one.request("ping", value=1))["echo"] == 1  # the event came first
        assert {"event": "state", "state": "ready"} in seen
    finally:
        await one.aclose()
        await other.aclose()


async def test_end_of_file_fails_waiting_requests_and_sets_closed() -> None:
    """The other process is gone: nobody waits forever."""
    left, right = socket.socketpair()

    async def never(message: dict[str, Any]) -> dict[str, Any] | None:
        right.close()  # the other end dies while the request is being handled
        return {"never": True}

    one = await Channel.open(left, never)
    try:
        right.sendall(encode({"id": 1, "op": "x"}))
        with pytest.raises(ChannelClosedError):
            await one.request("ping", timeout=5)
        await one.closed.wait()
    finally:
        await one.aclose()


def test_the_first_frame_can_be_read_without_a_loop() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(encode({"app": "m:app", "index": 2}))
        assert read_frame_blocking(right) == {"app": "m:app", "index": 2}
        left.close()
        with pytest.raises(ChannelClosedError):
            read_frame_blocking(right)
