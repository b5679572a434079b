"""SIGTERM under the servers users run themselves: the runtime drains before the server stops.

``runtime.install(app)`` and then ``uvicorn`` (h11, httptools), hypercorn in one process
(``--workers 0``) or gunicorn with one uvicorn worker: each test starts its own process of
tests/real_servers/signal_app.py, sends it real signals by PID and reads its log. The last test runs
hypercorn's default (a parent process takes the signals), which cannot be hooked: it must say so.
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
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from forgezero_lifecycle.core._httpx import tls_context

from ._control import CONTROL_TOKEN, READY, SOURCE_REVISION
from ._servers import RunningServer, start_server, stop_server

pytestmark = [pytest.mark.server, pytest.mark.anyio]

HOOKABLE_KINDS: Final = ("uvicorn-h11", "uvicorn-httptools", "hypercorn-single", "gunicorn")
STREAM_GRACE: Final = 1.0
BOUND: Final = 20.0
PROCESS: Final = "/_test/process"
COUNTERS: Final = "/_test/counters"
SETTLED: Final = "signal.drain_settled state=drained"
APP_SHUTDOWN: Final = "app.lifespan_shutdown"
#: The line uvicorn (and so gunicorn's uvicorn worker) logs when its own shutdown begins.
UVICORN_SHUTDOWN: Final = "Shutting down\n"


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    """Start tests/real_servers/signal_app.py under a server kind; every process is stopped by PID."""
    started: list[RunningServer] = []

    def run(
        kind: str, drain_timeout: float, *extra_args: str, measured: bool = True
    ) -> RunningServer:
        server = start_server(
            kind,
            "tests.real_servers.signal_app:app",
            log_path=tmp_path / f"{kind}.log",
            environment={
                "FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN,
                "FORGEZERO_REVISION": SOURCE_REVISION,
                "FORGEZERO_STREAM_GRACE": str(STREAM_GRACE),
                "FORGEZERO_SIGNAL_DRAIN_TIMEOUT": str(drain_timeout),
            },
            log_level="info",
            extra_args=extra_args,
            measured=measured,
        )
        started.append(server)
        return server

    try:
        yield run
    finally:
        for server in started:
            _stop_all(server)


def _stop_all(server: RunningServer) -> None:
    """The server and, for gunicorn, the worker it forked (found through the app)."""
    worker = _worker_pid(server)
    stop_server(server)
    if worker is not None and worker != server.process.pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)


def _worker_pid(server: RunningServer) -> int | None:
    if server.process.poll() is not None:
        return None
    try:
        pid: int = httpx.get(server.url + PROCESS, timeout=2.0, verify=tls_context()).json()["pid"]
    except httpx.HTTPError:
        return None
    return pid


async def _wait_for(check: Any, what: str, server: RunningServer) -> None:
    deadline = time.monotonic() + BOUND
    while not await check():
        assert time.monotonic() < deadline, f"not {what} within {BOUND} s:\n{server.log()}"
        await asyncio.sleep(0.02)


async def _wait_exit(server: RunningServer) -> int:
    try:
        return await asyncio.to_thread(server.process.wait, BOUND)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{server.kind} did not exit within {BOUND} s:\n{server.log()}")


async def _open_websocket(server: RunningServer) -> ClientConnection:
    websocket = await connect(server.ws_url + "/ws", open_timeout=5, close_timeout=5)
    await websocket.send("hello")
    assert await websocket.recv() == "hello"
    return websocket


async def _admitted(client: httpx.AsyncClient, http: int, websocket: int) -> bool:
    counters = (await client.get(COUNTERS)).json()
    return bool(counters["http"] >= http and counters["websocket"] >= websocket)


async def _not_ready(client: httpx.AsyncClient) -> bool:
    return (await client.get(READY)).status_code == 503


@pytest.mark.parametrize("kind", HOOKABLE_KINDS)
async def test_sigterm_drains_first(start: Any, kind: str) -> None:
    """SIGTERM: readiness 503, new work 503, the slow request ends 200, the WebSocket gets 1012
    at the stream grace, and the server's own stop begins only after the drain settled."""
    server: RunningServer = start(kind, 15.0)
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=BOUND, verify=tls_context()) as client,
        httpx.AsyncClient(base_url=server.url, timeout=BOUND, verify=tls_context()) as fresh,
    ):
        assert (await client.get(PROCESS)).json()["hooked"] == ["SIGTERM", "SIGINT"]
        websocket = await _open_websocket(server)
        slow = asyncio.create_task(client.get("/slow", params={"seconds": "3"}))
        await _wait_for(lambda: _admitted(client, 1, 1), "admitted", server)

        server.process.send_signal(signal.SIGTERM)  # gunicorn: its master, which signals the worker

        await _wait_for(lambda: _not_ready(fresh), "not ready", server)
        refused = await fresh.get("/fast")
        with pytest.raises(ConnectionClosed) as closed:
            async with asyncio.timeout(BOUND):
                await websocket.recv()
        response = await slow
        await websocket.close()
    await _wait_exit(server)

    assert refused.status_code == 503
    assert refused.json() == {"error": "RUNTIME_DRAINING"}
    assert refused.headers["connection"] == "close"
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1012, "draining")
    assert response.status_code == 200
    assert response.json() == {"slept": 3.0}
    log = server.log()
    assert "signal.drain signal=SIGTERM" in log
    assert SETTLED in log
    assert log.index(SETTLED) < log.index(APP_SHUTDOWN)
    if kind != "hypercorn-single":  # hypercorn logs nothing when its own stop begins
        assert log.index(SETTLED) < log.index(UVICORN_SHUTDOWN)


@pytest.mark.parametrize("kind", HOOKABLE_KINDS)
async def test_second_signal_to_server(start: Any, kind: str) -> None:
    """A second signal during the drain is the server's own stop: it begins before the drain
    settles, the request still running is cut, and the process is gone long before the
    drain's 30 s deadline (on 3.12.1+ the server's stop waits for every open connection)."""
    server: RunningServer = start(kind, 30.0)
    async with httpx.AsyncClient(
        base_url=server.url, timeout=BOUND, verify=tls_context()
    ) as client:
        worker: int = (await client.get(PROCESS)).json()["pid"]
        slow = asyncio.create_task(client.get("/slow", params={"seconds": "60"}))
        await _wait_for(lambda: _admitted(client, 1, 0), "admitted", server)

        server.process.send_signal(signal.SIGTERM)
        await _wait_for(lambda: _not_ready(client), "not ready", server)
        # gunicorn's master takes no second signal while it stops: the worker gets it.
        os.kill(worker, signal.SIGTERM)

        await _wait_exit(server)
        try:  # its connection is aborted at the second signal: no response at all
            async with asyncio.timeout(BOUND):
                cut: object = (await slow).status_code
        except httpx.HTTPError as error:
            cut = error

    assert isinstance(cut, httpx.HTTPError)
    log = server.log()
    assert "signal.forced signal=SIGTERM" in log
    assert "the requests still running are cut" in log
    stopped = log.index(UVICORN_SHUTDOWN if kind != "hypercorn-single" else "signal.forced")
    assert "signal.drain_settled" not in log[:stopped]


@pytest.mark.parametrize("kind", ["uvicorn-h11", "uvicorn-httptools"])
async def test_lifespan_off_hooks(start: Any, kind: str) -> None:
    """``--lifespan off``: the hook is installed by the first request and SIGTERM drains."""
    server: RunningServer = start(kind, 15.0, "--lifespan", "off")
    async with httpx.AsyncClient(
        base_url=server.url, timeout=BOUND, verify=tls_context()
    ) as client:
        assert (await client.get(PROCESS)).json()["hooked"] == ["SIGTERM", "SIGINT"]
        slow = asyncio.create_task(client.get("/slow", params={"seconds": "2"}))
        await _wait_for(lambda: _admitted(client, 1, 0), "admitted", server)
        server.process.send_signal(signal.SIGTERM)
        await _wait_for(lambda: _not_ready(client), "not ready", server)
        response = await slow
    await _wait_exit(server)

    assert response.status_code == 200
    log = server.log()
    assert APP_SHUTDOWN not in log  # no lifespan at all
    assert log.index(SETTLED) < log.index(UVICORN_SHUTDOWN)


async def test_hypercorn_parent_unhooked(start: Any) -> None:
    """hypercorn's default runs the app in a child that never gets the signal: nothing is
    hooked, a startup warning names ``forgezero-lifecycle serve``, and SIGTERM is hypercorn's."""
    # Unmeasured: coverage's own SIGTERM handler in the child would be a handler to hook.
    server: RunningServer = start("hypercorn", 15.0, measured=False)
    async with httpx.AsyncClient(
        base_url=server.url, timeout=BOUND, verify=tls_context()
    ) as client:
        assert (await client.get(PROCESS)).json()["hooked"] == []
    server.process.send_signal(signal.SIGTERM)
    await _wait_exit(server)

    log = server.log()
    assert "WARNING forgezero_lifecycle.signals signal.unhookable: SIGTERM cannot be hooked" in log
    assert "`forgezero-lifecycle serve`" in log
    assert "signal.drain " not in log
    assert log.count("signal.unhookable") == 1


@pytest.mark.parametrize("kind", ["uvicorn-h11", "gunicorn", "hypercorn-single"])
async def test_drain_told_in_the_servers_own_log(kind: str, tmp_path: Path) -> None:
    """An app that configures no logging (most do not) under the server's default logging:
    the signal's drain begins and settles in the server's own log, where its user looks."""
    server = start_server(
        kind,
        "tests.real_servers.quiet_app:app",
        log_path=tmp_path / f"{kind}.log",
        environment={"FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN},
        log_level="info",
        measured=False,  # coverage's own SIGTERM handler must not be the one hooked
    )
    try:
        server.process.send_signal(signal.SIGTERM)
        await _wait_exit(server)
    finally:
        _stop_all(server)
    log = server.log()
    assert "signal.drain signal=SIGTERM" in log, log
    assert "signal.drain_settled state=drained" in log, log
