"""By hand: the reconnect peak of WebSocket clients across a same-port handover.

``python -m tests.real_servers.handover_reconnects CLIENTS SPREAD [SPREAD ...]`` runs
tests/real_servers/ws_cutoff_app.py under ``forgezero-lifecycle serve --workers 1`` once per spread
(the runtime's ``stream_notice_spread``, seconds), opens CLIENTS raw WebSocket clients, sends
SIGHUP (a handover to a new generation on the same port) and has each client, once its close
arrives, open a new session at once. It prints, per spread, the busiest 100 ms of completed
reconnects (handshakes the new generation answered 101), the closes that were not 1012 (cut)
and the reconnects that were refused. Not a test: a 2-core machine shared with other work
makes the peak vary from run to run (docs/streams.md has the figures).
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

from ._control import CONTROL_TOKEN
from ._servers import start_server, stop_server

BUCKET: Final = 0.1
BOUND: Final = 120.0


async def _handshake(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET /ticks?interval=2 HTTP/1.1\r\nHost: test\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    return reader, writer, head.startswith(b"HTTP/1.1 101")


async def _clients(port: int, clients: int, hup: int) -> tuple[int, int, int]:
    codes: list[int] = []
    reconnects: list[float] = []
    refused = 0

    async def client(opened: asyncio.Event) -> None:
        nonlocal refused
        reader, writer, accepted = await _handshake(port)
        assert accepted
        opened.set()
        while True:
            first, second = await reader.readexactly(2)
            length = second & 0x7F
            if length >= 126:
                length = int.from_bytes(await reader.readexactly(2 if length == 126 else 8))
            payload = await reader.readexactly(length)
            if first & 0x0F == 0x8:  # close: answer it, then reconnect at once
                codes.append(int.from_bytes(payload[:2]))
                writer.write(b"\x88\x82\x00\x00\x00\x00" + payload[:2])
                writer.close()
                break
        _, again, accepted = await _handshake(port)
        if accepted:
            reconnects.append(time.monotonic())
        else:
            refused += 1
        again.close()

    opened = [asyncio.Event() for _ in range(clients)]
    async with asyncio.timeout(BOUND), asyncio.TaskGroup() as group:
        for event in opened:
            group.create_task(client(event))
        for event in opened:
            await event.wait()
        os.kill(hup, signal.SIGHUP)
    buckets = collections.Counter(int(moment / BUCKET) for moment in reconnects)
    return max(buckets.values()), sum(code != 1012 for code in codes), refused


def measure(clients: int, spread: float, log_path: Path) -> tuple[int, int, int]:
    """(reconnect peak per 100 ms, closes not 1012, reconnects refused) for one handover."""
    server = start_server(
        "serve-h11",
        "tests.real_servers.ws_cutoff_app:app",
        log_path=log_path,
        environment={
            "FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN,
            "FORGEZERO_STREAM_GRACE": "1",
            "FORGEZERO_NOTICE_SPREAD": str(spread),
        },
        log_level="info",
        extra_args=("--workers", "1", "--drain-timeout", "20s"),
        measured=False,
    )
    try:
        port = int(server.url.rsplit(":", 1)[1])
        return asyncio.run(_clients(port, clients, server.process.pid))
    finally:
        stop_server(server)


if __name__ == "__main__":
    count = int(sys.argv[1])
    with tempfile.TemporaryDirectory() as directory:
        for spread in map(float, sys.argv[2:]):
            peak, cut, refused = measure(count, spread, Path(directory) / f"{spread}.log")
            print(
                f"clients={count} spread={spread} peak_per_100ms={peak} cut={cut} refused={refused}"
            )
