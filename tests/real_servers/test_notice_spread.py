"""The stream notice's spread under a real server: reconnects come spread out, not as a storm.

``CLIENTS`` raw WebSocket clients (reading frames) on a push-only route of
tests/real_servers/ws_cutoff_app.py under uvicorn; SIGTERM begins the drain. Each client notes when
its close 1012 arrives, the moment it would reconnect to the next generation. With
``stream_notice_spread=0`` every close comes in the same instant; with 2 s (the default) the
busiest 100 ms holds at most a fifth as many. No client is cut: every one gets 1012.

CLIENTS is kept to what a shared 2-core machine runs in seconds; ``measure`` is also run by
hand with 1,000 (``python -m tests.real_servers.test_notice_spread 1000``).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

import pytest

from ._control import CONTROL_TOKEN
from ._servers import RunningServer, start_server, stop_server

pytestmark = [pytest.mark.server]

CLIENTS: Final = 200
#: The width of the buckets the reconnect peak is counted in.
BUCKET: Final = 0.1
#: Seconds between the route's messages: each session's app ends at its first send after the
#: close, so a slow ticker keeps the client busy for little.
TICK: Final = "2"
SPREAD_ON: Final = 2.0
#: Bound of every wait of the clients for their close.
BOUND: Final = 30.0


def _start(spread: float, log_path: Path) -> RunningServer:
    return start_server(
        "uvicorn-h11",
        "tests.real_servers.ws_cutoff_app:app",
        log_path=log_path,
        environment={
            "FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN,
            "FORGEZERO_STREAM_GRACE": "1",
            "FORGEZERO_SIGNAL_DRAIN_TIMEOUT": "10",
            "FORGEZERO_NOTICE_SPREAD": str(spread),
        },
        log_level="info",
        extra_args=("--timeout-graceful-shutdown", "20"),
        measured=False,
    )


async def _count_reconnects(server: RunningServer, clients: int) -> tuple[int, list[int]]:
    """Open ``clients`` sessions, signal the server, and return the reconnect peak per BUCKET
    and every client's close code.

    The clients are raw sockets that read frames and note the instant a close frame arrives
    (then answer it): a full client library per session would make the client process, not
    the server, decide when closes are seen."""
    port = int(server.url.rsplit(":", 1)[1])
    closes: list[tuple[float, int]] = []

    async def client(opened: asyncio.Event) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            key = base64.b64encode(os.urandom(16)).decode()
            writer.write(
                f"GET /ticks?interval={TICK} HTTP/1.1\r\nHost: test\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n".encode()
            )
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 101"), head
            opened.set()
            while True:
                first, second = await reader.readexactly(2)
                length = second & 0x7F
                if length >= 126:
                    length = int.from_bytes(await reader.readexactly(2 if length == 126 else 8))
                payload = await reader.readexactly(length)
                if first & 0x0F == 0x8:  # close
                    closes.append((time.monotonic(), int.from_bytes(payload[:2])))
                    # The answer, masked with a zero key (RFC 6455 5.3: any key will do).
                    writer.write(b"\x88\x82\x00\x00\x00\x00" + payload[:2])
                    await writer.drain()
                    return
        finally:
            writer.close()

    opened = [asyncio.Event() for _ in range(clients)]
    async with asyncio.timeout(BOUND), asyncio.TaskGroup() as group:
        for event in opened:
            group.create_task(client(event))
        for event in opened:
            await event.wait()
        server.process.send_signal(signal.SIGTERM)
        # The task group ends once every client has seen its close.
    buckets = collections.Counter(int(moment / BUCKET) for moment, _ in closes)
    return max(buckets.values()), [code for _, code in closes]


def measure(clients: int, spread: float, log_path: Path) -> tuple[int, list[int]]:
    server = _start(spread, log_path)
    try:
        return asyncio.run(_count_reconnects(server, clients))
    finally:
        stop_server(server)


def test_spread_cuts_peak_to_fifth(tmp_path: Path) -> None:
    """With the spread, the reconnect peak is at most a fifth of the peak without it; every client
    still gets 1012."""
    peak_off, codes_off = measure(CLIENTS, 0.0, tmp_path / "off.log")
    peak_on, codes_on = measure(CLIENTS, SPREAD_ON, tmp_path / "on.log")
    assert codes_off == [1012] * CLIENTS
    assert codes_on == [1012] * CLIENTS
    assert peak_on * 5 <= peak_off, (peak_on, peak_off)


if __name__ == "__main__":
    count = int(sys.argv[1])
    with tempfile.TemporaryDirectory() as directory:
        for spread in (0.0, SPREAD_ON):
            peak, codes = measure(count, spread, Path(directory) / f"{spread}.log")
            cut = sum(code != 1012 for code in codes)
            print(f"clients={count} spread={spread} peak_per_100ms={peak} cut={cut}")
