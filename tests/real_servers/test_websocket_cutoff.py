"""WebSocket clients that never read cannot keep a drain, or the process, from ending.

Twenty raw clients (sockets that do the WebSocket handshake, then never read and never answer a
close) on a push-only route, under uvicorn (h11, httptools), hypercorn (one process, so its
signals reach the app) and ``forgezero-lifecycle serve`` (h11, httptools, two workers); then
SIGTERM. On ``/push`` every send is blocked before the signal (the app says when): each connection
is abandoned at the cutoff and logged once. On ``/ticks`` the close 1012 goes out and is never answered (under
uvicorn's older WebSocket protocol, whose close waits for the client's, it is given up at the
cutoff as on ``/push``: ``CLOSE_WAITS_FOR_THE_CLIENT``). Either
way the drain reports ``drained`` and the process exits within the bound docs/streams.md gives:
the deadline, plus the first-byte grace and the linger under ``serve``, plus the close
handshake's timeout (``CLOSE_HANDSHAKE_TIMEOUT``). The servers' own graceful timeouts are set
far above that, so a connection left open would show as a late exit.

The server-push case: twenty clients (the ``websockets`` library) that read every message of
``/ticks`` (one every 100 ms) and answer the close, under the runtime's default notice spread,
with both of uvicorn's WebSocket protocols; the same bound holds, and every client gets 1012.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from forgezero_lifecycle.asgi.middleware import CLOSE_HANDSHAKE_TIMEOUT
from forgezero_lifecycle.serve.connections import LINGER_TIMEOUT

from ._control import CONTROL_TOKEN
from ._servers import RunningServer, start_server, stop_server

pytestmark = pytest.mark.server

CLIENTS: Final = 20
#: The drain's deadline (signal_drain_timeout, serve's --drain-timeout), in seconds.
DEADLINE: Final = 5.0
#: serve's default --first-byte-grace.
FIRST_BYTE_GRACE: Final = 1.0
#: The documented bound of the exit after the signal (docs/streams.md).
EXIT_BOUND: Final = DEADLINE + FIRST_BYTE_GRACE + max(LINGER_TIMEOUT, CLOSE_HANDSHAKE_TIMEOUT)
#: Room for a loaded machine (process teardown, the log flush) on top of the bound.
SLACK: Final = 3.0
#: Bound of the wait for a supervisor to serve.
STARTED_BOUND: Final = 30.0
#: The servers' own graceful timeouts: far above the bound, so only the library can meet it.
SERVER_GRACE: Final = "60"
#: Whether the uvicorn installed runs ``--ws auto`` on websockets' legacy protocol (uvicorn
#: before its websockets-sansio one became the default; ``make test-oldest``), whose close waits
#: for the client's close frame: a client that never reads never sends one.
CLOSE_WAITS_FOR_THE_CLIENT: Final = (
    getattr(AutoWebSocketsProtocol, "__name__", None) == "WebSocketProtocol"
)
#: Each way of running the app: the server kind and its extra arguments.
SERVERS: Final = {
    "uvicorn-h11": ("uvicorn-h11", "--timeout-graceful-shutdown", SERVER_GRACE),
    "uvicorn-httptools": ("uvicorn-httptools", "--timeout-graceful-shutdown", SERVER_GRACE),
    "hypercorn-single": ("hypercorn-single", "--graceful-timeout", SERVER_GRACE),
    "serve-h11": ("serve-h11", "--drain-timeout", f"{DEADLINE:g}s"),
    "serve-httptools": ("serve-httptools", "--drain-timeout", f"{DEADLINE:g}s"),
    "serve-workers": ("serve-h11", "--drain-timeout", f"{DEADLINE:g}s", "--workers", "2"),
}


@pytest.fixture
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningServer]:
    kind, *extra_args = SERVERS[request.param]
    running = start_server(
        kind,
        "tests.real_servers.ws_cutoff_app:app",
        log_path=tmp_path / f"{kind}.log",
        environment={
            "FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN,
            "FORGEZERO_STREAM_GRACE": "1",
            "FORGEZERO_SIGNAL_DRAIN_TIMEOUT": str(DEADLINE),
        },
        log_level="info",
        extra_args=extra_args,
        measured=False,
    )
    try:
        if "--workers" in extra_args:
            # The first worker answers the liveness probe before the supervisor serves: a
            # SIGTERM before then stops the start instead of draining.
            _wait_for_log(running, "supervisor.serving")
        yield running
    finally:
        stop_server(running)


def _wait_for_log(server: RunningServer, text: str, count: int = 1) -> None:
    deadline = time.monotonic() + STARTED_BOUND
    while server.log().count(text) < count:
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{server.log()}"
        time.sleep(0.05)


@contextlib.contextmanager
def non_reading_clients(server: RunningServer, path: str) -> Iterator[list[socket.socket]]:
    """CLIENTS raw WebSocket connections to ``path``, handshake done, never read again."""
    port = int(server.url.rsplit(":", 1)[1])
    clients: list[socket.socket] = []
    try:
        for _ in range(CLIENTS):
            client = socket.create_connection(("127.0.0.1", port), timeout=10)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            clients.append(client)
            key = base64.b64encode(os.urandom(16)).decode()
            client.sendall(
                f"GET {path} HTTP/1.1\r\nHost: test\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n".encode()
            )
            head = client.recv(12)  # the status line's start; the rest is never read
            assert head == b"HTTP/1.1 101", head
        yield clients
    finally:
        for client in clients:
            client.close()


@pytest.mark.parametrize("server", list(SERVERS), indirect=True)
@pytest.mark.parametrize("path", ["/push", "/ticks"])
def test_non_readers_cut_off(server: RunningServer, path: str) -> None:
    """Non-reading WebSocket clients neither fail the drain nor hold the process: after SIGTERM it
    exits within the bound, and the drain ends drained, not failed."""
    with non_reading_clients(server, path):
        if path == "/push":  # every send blocked before the signal (the app says so)
            _wait_for_log(server, "push.blocked", CLIENTS)
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=EXIT_BOUND + SLACK)
        except subprocess.TimeoutExpired:
            pytest.fail(f"not exited {EXIT_BOUND + SLACK} s after SIGTERM:\n{server.log()}")
    log = server.log()
    assert "drain.drained" in log, log
    assert "drain.failed" not in log, log
    assert "websocket_connection_unknown" not in log, log
    abandoned = log.count("drain.connection_abandoned kind=websocket")
    if path == "/push":  # every send blocked: each connection given up, and logged, once
        assert abandoned == CLIENTS, log
    elif server.kind.startswith("hypercorn") or not CLOSE_WAITS_FOR_THE_CLIENT:
        assert abandoned == 0, log  # the close 1012 went out, into a buffer nobody reads
    else:  # each close waited for the client's until the cutoff, which gave it up
        assert abandoned == CLIENTS, log


#: The ways of running the server-push case: server kind, extra arguments, the notice spread.
#: uvicorn's WebSocket protocols are both run (websockets' sans-I/O one is ``auto``).
PUSH_SERVERS: Final = {
    "uvicorn-h11": ("uvicorn-h11", "--timeout-graceful-shutdown", SERVER_GRACE),
    "uvicorn-httptools-wsproto": (
        "uvicorn-httptools", "--timeout-graceful-shutdown", SERVER_GRACE, "--ws", "wsproto",
    ),
    "serve-h11": ("serve-h11", "--drain-timeout", f"{DEADLINE:g}s"),
    "serve-h11-wsproto": ("serve-h11", "--drain-timeout", f"{DEADLINE:g}s", "--ws", "wsproto"),
    "serve-httptools": ("serve-httptools", "--drain-timeout", f"{DEADLINE:g}s"),
    "serve-workers": ("serve-h11", "--drain-timeout", f"{DEADLINE:g}s", "--workers", "2"),
}  # fmt: skip
#: The push interval of ``/ticks`` in the server-push case (a user's ticker, not a flood).
PUSH_INTERVAL: Final = 0.1


@pytest.fixture
def push_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningServer]:
    kind, *extra_args = PUSH_SERVERS[request.param]
    running = start_server(
        kind,
        "tests.real_servers.ws_cutoff_app:app",
        log_path=tmp_path / f"{kind}.log",
        environment={
            "FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN,
            "FORGEZERO_STREAM_GRACE": "1",
            "FORGEZERO_SIGNAL_DRAIN_TIMEOUT": str(DEADLINE),
            "FORGEZERO_NOTICE_SPREAD": "2",  # the runtime's default spread
        },
        log_level="info",
        extra_args=extra_args,
        measured=False,
    )
    try:
        if "--workers" in extra_args:
            _wait_for_log(running, "supervisor.serving")
        yield running
    finally:
        stop_server(running)


async def _push_then_stop(server: RunningServer) -> tuple[list[int | None], float]:
    """CLIENTS reading clients on ``/ticks``, SIGTERM once each has a message: every client's
    close code, and the seconds from the signal to the process's exit."""
    url = f"{server.ws_url}/ticks?interval={PUSH_INTERVAL}"
    codes: list[int | None] = []

    async def reader(opened: asyncio.Event) -> None:
        async with connect(url, proxy=None, open_timeout=STARTED_BOUND) as session:
            await session.recv()
            opened.set()
            try:
                async for _ in session:  # reads everything, answers the close
                    pass
            except ConnectionClosed:
                pass
            codes.append(session.close_code)

    events = [asyncio.Event() for _ in range(CLIENTS)]
    readers = [asyncio.ensure_future(reader(opened)) for opened in events]
    try:
        async with asyncio.timeout(STARTED_BOUND):
            await asyncio.gather(*(opened.wait() for opened in events))
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(EXIT_BOUND + SLACK):
            await asyncio.gather(*readers)
        with contextlib.suppress(subprocess.TimeoutExpired):  # measured, asserted by the test
            await asyncio.to_thread(server.process.wait, EXIT_BOUND + SLACK)
        exited = time.monotonic() - signalled
    finally:
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    return codes, exited


@pytest.mark.parametrize("push_server", list(PUSH_SERVERS), indirect=True)
def test_server_push_readers_exit_within_bound(push_server: RunningServer) -> None:
    """Server-push sessions (the app only sends, every 100 ms) whose clients read everything and
    answer the close: every client gets 1012, the drain ends drained, and the process exits
    within the bound of docs/streams.md after SIGTERM, on every run."""
    codes, exited = asyncio.run(_push_then_stop(push_server))
    log = push_server.log()
    assert codes == [1012] * CLIENTS, log
    # The bound plus SLACK (3 s) for a loaded machine: a connection that held the stop until the
    # server's own graceful timeout (DEADLINE + 5 s under serve, 60 s under uvicorn) is past it.
    assert exited <= EXIT_BOUND + SLACK, f"exit {exited:.2f} s after SIGTERM:\n{log}"
    assert "drain.drained" in log, log
    assert "drain.failed" not in log, log
