"""Long-lived work told in time, under every server as a real process, stopped by SIGTERM.

tests/real_servers/long_lived_app.py under uvicorn, ``forgezero-lifecycle serve`` (one process
and ``--workers 2``), hypercorn in one process and gunicorn's uvicorn worker. One test per
server and path, kept fast (short deadlines; the tests wait on what the processes record and
on the end of their streams, not on sleeps):

* a stream that waits on ``scope["extensions"]["forgezero.drain"]`` sends its last event and
  ends cleanly; streams that do not (chunked, and with a Content-Length) are cut so that httpx
  sees the body incomplete; work started with ``runtime.create_task`` just before the signal
  completes; ``serve`` exits 0;
* the stop's order: the drain and the background work, then the app's lifespan shutdown, then
  the connections (an idle keep-alive connection is closed only after the shutdown ran);
* a lifespan shutdown that hangs is bounded: logged, and the process exits within the drain's
  deadline plus the teardown margin (``serve`` with exit 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from forgezero_lifecycle.core._httpx import tls_context

from ._control import CONTROL_TOKEN, SOURCE_REVISION
from ._servers import RunningServer, start_server, stop_server

pytestmark = [pytest.mark.server, pytest.mark.anyio]

#: Server kinds whose stop the runtime owns (serve, or the signal hook), with extra arguments.
STOPS: Final = {
    "uvicorn-h11": (),
    "serve-h11": ("--drain-timeout", "4s"),
    "serve-workers-2": ("--drain-timeout", "4s", "--workers", "2"),
    "hypercorn-single": (),
    "gunicorn": (),
}
STREAM_KINDS: Final = ("uvicorn-h11", "serve-h11", "hypercorn-single", "gunicorn")
DRAIN_TIMEOUT: Final = 4.0
MARGIN: Final = 0.5
BOUND: Final = 20.0
PROCESS: Final = "/_test/process"


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    """Start the app under a server kind; every process it started is stopped by PID."""
    started: list[RunningServer] = []

    def run(kind: str, *, hang: bool = False) -> tuple[RunningServer, Path]:
        record = tmp_path / f"{kind}.record"
        record.touch()
        server = start_server(
            "serve-h11" if kind.startswith("serve-") else kind,
            "tests.real_servers.long_lived_app:app",
            log_path=tmp_path / f"{kind}.log",
            environment={
                "FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN,
                "FORGEZERO_REVISION": SOURCE_REVISION,
                "FORGEZERO_STREAM_GRACE": "0.3",
                "FORGEZERO_SIGNAL_DRAIN_TIMEOUT": str(DRAIN_TIMEOUT),
                "FORGEZERO_TEARDOWN_MARGIN": str(MARGIN),
                "FORGEZERO_TEST_RECORD": str(record),
                "FORGEZERO_TEST_HANG_SHUTDOWN": "1" if hang else "0",
            },
            log_level="info",
            extra_args=STOPS[kind],
            measured=False,  # coverage's own SIGTERM handler must not stand in the hook's way
        )
        started.append(server)
        return server, record

    try:
        yield run
    finally:
        for server in started:
            _stop_all(server)


def _stop_all(server: RunningServer) -> None:
    """The server and, for gunicorn, the worker it forked (found through the app)."""
    worker = None
    with contextlib.suppress(httpx.HTTPError):
        if server.process.poll() is None:
            worker = httpx.get(server.url + PROCESS, timeout=2.0, verify=tls_context()).json()[
                "pid"
            ]
    stop_server(server)
    if worker is not None and worker != server.process.pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)


async def _wait_exit(server: RunningServer, bound: float = BOUND) -> int:
    try:
        return await asyncio.to_thread(server.process.wait, bound)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{server.kind} did not exit within {bound} s:\n{server.log()}")


async def _admitted(client: httpx.AsyncClient, http: int) -> None:
    deadline = time.monotonic() + BOUND
    while (await client.get(PROCESS)).json()["in_flight"]["http"] < http:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


async def _read(client: httpx.AsyncClient, path: str, opened: asyncio.Event) -> str | Exception:
    """The whole body of a stream, or the error reading it raised (a cut)."""
    body = ""
    try:
        async with client.stream("GET", path) as response:
            assert response.status_code == 200
            async for text in response.aiter_text():
                body += text
                opened.set()
    except httpx.HTTPError as error:
        return error
    return body


@pytest.mark.parametrize("kind", STREAM_KINDS)
async def test_told_stream_ends_cut_stream_seen(start: Any, kind: str) -> None:
    """SIGTERM: the stream waiting on the notice sends its last event and ends cleanly; the
    chunked and the sized streams that ignore it are cut (httpx raises); background work
    begun just before the signal completes; serve exits 0."""
    server, record = start(kind)
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(
        base_url=server.url, timeout=BOUND, limits=limits, verify=tls_context()
    ) as client:
        opened = [asyncio.Event() for _ in range(3)]
        reads = [
            asyncio.create_task(_read(client, path, event))
            for path, event in zip(("/sse", "/chunked", "/sized"), opened, strict=True)
        ]
        for event in opened:
            await asyncio.wait_for(event.wait(), BOUND)
        assert (await client.get("/background", params={"seconds": "0.5"})).status_code == 202
        await _admitted(client, 3)
        server.process.send_signal(signal.SIGTERM)
        told, chunked, sized = await asyncio.gather(*reads)
    code = await _wait_exit(server)
    assert isinstance(told, str), told
    assert told.endswith("retry: 100\nevent: draining\ndata: this generation stops\n\n")
    assert isinstance(chunked, httpx.RemoteProtocolError), chunked
    assert "incomplete chunked read" in str(chunked)
    assert isinstance(sized, httpx.RemoteProtocolError), sized
    assert "background done" in record.read_text(), server.log()
    if kind.startswith("serve-"):
        assert code == 0, server.log()
    assert "Traceback" not in server.log()


def _lines(record: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in record.read_text().splitlines()]


@pytest.mark.parametrize("kind", STOPS)
async def test_stop_order(start: Any, kind: str) -> None:
    """The drain and the background work, then the app's lifespan shutdown, then the
    connections: an idle keep-alive connection is closed only once the shutdown has run."""
    server, record = start(kind)
    host, port = server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"GET {PROCESS} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        await writer.drain()
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        async with httpx.AsyncClient(
            base_url=server.url, timeout=BOUND, verify=tls_context()
        ) as client:
            assert (await client.get("/background", params={"seconds": "0.5"})).status_code == 202
        server.process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(reader.read(), BOUND)  # to the end: the connection closed
        closed = _lines(record)
    finally:
        writer.close()
    code = await _wait_exit(server)
    assert "background done" in closed, server.log()
    assert closed.index("background done") < closed.index("lifespan shutdown"), closed
    assert "lifespan shutdown done" in closed, server.log()
    if kind.startswith("serve-"):
        assert code == 0, server.log()


@pytest.mark.parametrize("kind", STOPS)
async def test_hung_teardown_bounded(start: Any, kind: str) -> None:
    """A lifespan shutdown that never ends is logged and cut at what is left of the drain's
    deadline plus the margin: the process exits in time, serve with exit 1."""
    server, record = start(kind, hang=True)
    server.process.send_signal(signal.SIGTERM)
    began = time.monotonic()
    code = await _wait_exit(server, DRAIN_TIMEOUT + MARGIN + 10.0)
    log = server.log()
    assert time.monotonic() - began < DRAIN_TIMEOUT + MARGIN + 8.0
    assert "teardown.lifespan_overran" in log, log
    assert "lifespan shutdown" in _lines(record)
    assert "lifespan shutdown done" not in _lines(record)
    if kind.startswith("serve-"):  # a worker's failed stop fails the supervisor's too
        assert code == 1, log
