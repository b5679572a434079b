"""The private channel: length-prefixed orjson requests, answers and events on a socket pair."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from typing import Any

import pytest

from forgezero_lifecycle.serve.channel import (
    MAX_MESSAGE_BYTES,
    Channel,
    ChannelClosedError,
    MessageTooLargeError,
    encode,
    read_frame_blocking,
)

pytestmark = pytest.mark.anyio


async def test_requests_and_events() -> None:
    """Requests are answered and events arrive, both ways."""
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


async def test_eof_fails_waiters() -> None:
    """End of file fails the waiting requests and sets ``closed``: the other process is gone, nobody
    waits forever."""
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


def test_first_frame_without_loop() -> None:
    """The first frame can be read without an event loop."""
    left, right = socket.socketpair()
    with left, right:
        left.sendall(encode({"app": "m:app", "index": 2}))
        assert read_frame_blocking(right) == {"app": "m:app", "index": 2}
        left.close()
        with pytest.raises(ChannelClosedError):
            read_frame_blocking(right)


async def test_bad_frame_skipped() -> None:
    """A frame over the limit, one that is not JSON and one that is not an object are skipped
    (issue 23, row 2: an oversized frame used to end the channel, and the worker with it)."""
    left, right = socket.socketpair()
    seen: list[dict[str, Any]] = []

    async def echo(message: dict[str, Any]) -> dict[str, Any] | None:
        seen.append(message)
        return {"echo": message.get("value")}

    one = await Channel.open(left, echo)
    other = await Channel.open(right, echo)
    try:
        oversized = MAX_MESSAGE_BYTES + 1
        writer = socket.socket(fileno=os.dup(right.fileno()))
        with writer:
            writer.setblocking(True)
            await asyncio.to_thread(
                writer.sendall,
                struct.pack("!I", oversized) + b"x" * oversized
                + struct.pack("!I", 3) + b"{no" + struct.pack("!I", 2) + b"[]",
            )  # fmt: skip
        assert (await other.request("ping", value=1))["echo"] == 1
        assert not one.closed.is_set()
        assert seen == [{"id": 1, "op": "ping", "value": 1}]
    finally:
        await one.aclose()
        await other.aclose()


async def test_sender_refuses_oversize() -> None:
    """The sender refuses a message over the limit: nothing is sent, the channel and the other side
    are untouched."""
    left, right = socket.socketpair()

    async def echo(message: dict[str, Any]) -> dict[str, Any] | None:
        return {"echo": message.get("value")}

    one = await Channel.open(left, echo)
    other = await Channel.open(right, echo)
    try:
        with pytest.raises(MessageTooLargeError):
            await one.request("ping", value="x" * (MAX_MESSAGE_BYTES + 1))
        assert (await one.request("ping", value=2))["echo"] == 2
    finally:
        await one.aclose()
        await other.aclose()
