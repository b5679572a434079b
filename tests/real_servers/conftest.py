"""Fixtures of the real-server tests: one process per server kind, shared by the whole session.

Each test begins its own drain with a fresh nonce; the ``control`` fixture rolls it back
afterwards and waits until the server is serving and idle again, so tests do not leak into each
other while the (slow to start) server processes are reused. After each test the server's log
must hold no traceback or error (``server_log``): a protocol error the client cannot see still
fails the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from forgezero_lifecycle.core._httpx import tls_context

from ._control import CONTROL_TOKEN, SOURCE_REVISION, STREAM_GRACE, WireControl
from ._servers import SERVER_KINDS, RunningServer, start_server, stop_server

_LOG_ALARMS = ("Traceback", "ERROR", "Exception in ASGI")
#: uvicorn's websockets-sansio implementation (its default WebSocket protocol) logs this after
#: every ``websocket.http.response`` denial, though the client got the denial intact: it never
#: marks the handshake complete on that path (Kludex/uvicorn pull request 3138, open).
_KNOWN_QUIRKS = ("ERROR:    ASGI callable returned without completing handshake.",)


@pytest.fixture(scope="session", params=SERVER_KINDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """The test app (tests/real_servers/app.py) running under one real server."""
    yield from run_test_app(request.param, "tests.real_servers.app:app", tmp_path_factory)


def run_test_app(
    kind: str, target: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """Run ``target`` under ``kind`` with the test control token, revision and stream grace."""
    running = start_server(
        kind,
        target,
        log_path=tmp_path_factory.mktemp("servers") / f"{kind}.log",
        environment={
            "FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN,
            "FORGEZERO_REVISION": SOURCE_REVISION,
            "FORGEZERO_STREAM_GRACE": str(STREAM_GRACE),
        },
    )
    try:
        yield running
    finally:
        stop_server(running)


@pytest.fixture
async def http(server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the server (keep-alive pool, closed after the test)."""
    async with httpx.AsyncClient(base_url=server.url, timeout=10.0, verify=tls_context()) as client:
        yield client


class ServerLog:
    """What the server logged during one test; :meth:`take` hands out each line once."""

    def __init__(self, server: RunningServer) -> None:
        self._server = server
        self._seen = len(server.log())

    def take(self) -> str:
        log = self._server.log()
        new, self._seen = log[self._seen :], len(log)
        return new


@pytest.fixture
def server_log(server: RunningServer) -> Iterator[ServerLog]:
    """The server's log during this test; whatever the test did not take must hold no error."""
    watch = ServerLog(server)
    yield watch
    new_log = watch.take()
    for quirk in _KNOWN_QUIRKS:
        new_log = new_log.replace(quirk, "")
    assert not any(alarm in new_log for alarm in _LOG_ALARMS), new_log


@pytest.fixture
async def control(server_log: ServerLog, http: httpx.AsyncClient) -> AsyncIterator[WireControl]:
    """The control client; afterwards every drain it began is rolled back."""
    client = WireControl(http)
    yield client
    await client.reset()
