"""The signal hook's bookkeeping, with real signals sent to this test process.

Each test puts a stand-in "server handler" in place first (``signal.signal`` as uvicorn does, or
``loop.add_signal_handler`` as hypercorn ``--workers 0`` does), so a signal never reaches the
default disposition, and puts the process's own handlers back afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from forgezero_lifecycle._errors import ConfigurationError
from forgezero_lifecycle.core.self_drain import UNKNOWN_REVISION, self_drain_request
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.testing import ASGIRecorder, settle
from forgezero_lifecycle.wire.drain import parse_drain_request

pytestmark = pytest.mark.anyio

REVISION = "ab" * 20
BOUND = 10.0


class ServerHandler:
    """A server's signal handler: records what it was handed."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.called = asyncio.Event()

    def __call__(self, signum: int, frame: FrameType | None = None) -> None:
        self.received.append(signum)
        self.called.set()

    async def wait(self, count: int = 1) -> None:
        async with asyncio.timeout(BOUND):
            while len(self.received) < count:
                self.called.clear()
                await self.called.wait()


@pytest.fixture
def restored_signals() -> Iterator[None]:
    """Whatever a test does to SIGTERM/SIGINT, the process's own handlers come back."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


@pytest.fixture
def plain_server(restored_signals: None) -> ServerHandler:
    """uvicorn's way: ``signal.signal(sig, server.handle_exit)``."""
    handler = ServerHandler()
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return handler


def runtime(**options: Any) -> Runtime:
    return Runtime(insecure_loopback_control=True, revision=REVISION, **options)


async def wait_draining(rt: Runtime) -> None:
    async with asyncio.timeout(BOUND):
        await rt.draining.wait()


async def test_sigterm_drains_then_passes(
    plain_server: ServerHandler,
) -> None:
    """The signal begins the drain; the server's handler gets it only once the drain settled,
    and is back in place by then."""
    rt = runtime(signal_drain_timeout=5.0)
    rt.signal_drain.install()
    assert rt.signal_drain.hooked == ("SIGTERM", "SIGINT")
    assert signal.getsignal(signal.SIGTERM) is not plain_server
    assert rt.gate.admit_http()  # an admitted request keeps the drain open

    os.kill(os.getpid(), signal.SIGTERM)
    await wait_draining(rt)
    await settle()
    assert plain_server.received == []  # draining: the server has not been told yet
    rt.gate.release_http()
    await plain_server.wait()

    assert plain_server.received == [signal.SIGTERM]
    assert await rt.drain.wait() == "drained"
    assert signal.getsignal(signal.SIGTERM) is plain_server
    assert signal.getsignal(signal.SIGINT) is plain_server
    assert rt.signal_drain.hooked == ()


async def test_second_signal_goes_through(
    plain_server: ServerHandler,
) -> None:
    """A second signal goes to the server's handler at once; the drain is no longer followed,
    so the server is not handed the first signal again when it settles."""
    rt = runtime(signal_drain_timeout=5.0)
    rt.signal_drain.install()
    assert rt.gate.admit_http()

    os.kill(os.getpid(), signal.SIGINT)
    await wait_draining(rt)
    os.kill(os.getpid(), signal.SIGTERM)
    await plain_server.wait()
    assert plain_server.received == [signal.SIGTERM]
    await settle()
    assert signal.getsignal(signal.SIGTERM) is plain_server  # later signals: the server's

    rt.gate.release_http()
    assert await rt.drain.wait() == "drained"
    await settle()
    assert plain_server.received == [signal.SIGTERM]


async def test_signal_follows_drain(
    plain_server: ServerHandler,
) -> None:
    """No second drain: the signal waits for the orchestrator's, then tells the server."""
    rt = runtime(signal_drain_timeout=5.0)
    rt.signal_drain.install()
    request = self_drain_request(REVISION, 5.0)
    rt.gate.admit_http()
    rt.drain.begin(request)

    os.kill(os.getpid(), signal.SIGTERM)
    await settle()
    assert plain_server.received == []
    rt.gate.release_http()
    await plain_server.wait()

    status = rt.drain.status(request["nonce"])  # still the orchestrator's drain
    assert status.status == "drained"


async def test_followed_drain_bounded(
    plain_server: ServerHandler, caplog: pytest.LogCaptureFixture
) -> None:
    """An orchestrator's longer drain does not hold the stop past ``signal_drain_timeout``."""
    rt = runtime(signal_drain_timeout=0.2)
    rt.signal_drain.install()
    request = self_drain_request(REVISION, 30.0)
    rt.gate.admit_http()  # never released: the orchestrator's drain stays draining
    rt.drain.begin(request)

    with caplog.at_level(logging.INFO, logger="forgezero_lifecycle.signals"):
        os.kill(os.getpid(), signal.SIGTERM)
        await plain_server.wait()

    assert rt.drain.status(request["nonce"]).status == "draining"
    assert "signal.follow_timeout" in caplog.text
    assert "signal.drain_settled state=failed" in caplog.text
    rt.drain.rollback(request["nonce"])


async def test_loop_handlers_wrapped(restored_signals: None) -> None:
    """hypercorn's way (``loop.add_signal_handler``): wrapped in the loop's table, put back."""
    loop = asyncio.get_running_loop()
    received: list[str] = []
    stopped = asyncio.Event()

    def hypercorn_handler(*args: Any) -> None:
        received.append("stop")
        stopped.set()

    loop.add_signal_handler(signal.SIGTERM, hypercorn_handler)
    try:
        rt = runtime(signal_drain_timeout=5.0)
        rt.signal_drain.install()
        assert rt.signal_drain.hooked == ("SIGTERM",)  # SIGINT is Python's own under pytest

        os.kill(os.getpid(), signal.SIGTERM)
        async with asyncio.timeout(BOUND):
            await stopped.wait()

        assert received == ["stop"]
        assert await rt.drain.wait() == "drained"
        restored = loop._signal_handlers[signal.SIGTERM]
        assert restored._callback is hypercorn_handler
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


async def test_no_server_handler_no_hook(
    restored_signals: None, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGTERM the default and SIGINT Python's own (as under pytest started from a terminal;
    set here, since a run started in the background of a shell inherits SIGINT ignored): one
    warning names serve."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    rt = runtime()
    with caplog.at_level(logging.WARNING, logger="forgezero_lifecycle.signals"):
        rt.signal_drain.install()
        rt.signal_drain.install()  # tried once per lifespan

    assert rt.signal_drain.hooked == ()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "SIGTERM cannot be hooked" in warnings[0]
    assert "`forgezero-lifecycle serve`" in warnings[0]


def test_unreadable_loop_not_hooked(
    restored_signals: None, caplog: pytest.LogCaptureFixture
) -> None:
    """uvloop dispatches its own registered handlers whatever Python's table holds, and its
    table is out of reach: wrapping would drain and stop at once, so it is left alone."""
    import uvloop  # uvicorn[standard], a dev dependency: missing is a failure, not a skip

    rt = runtime()
    registered: list[object] = []

    async def serve_like_hypercorn() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, lambda: None)
        registered.append(signal.getsignal(signal.SIGTERM))
        rt.signal_drain.install()
        registered.append(signal.getsignal(signal.SIGTERM))
        loop.remove_signal_handler(signal.SIGTERM)

    with caplog.at_level(logging.WARNING, logger="forgezero_lifecycle.signals"):
        uvloop.run(serve_like_hypercorn())

    assert rt.signal_drain.hooked == ()
    assert registered[0] is registered[1] or registered[0] == registered[1]
    assert "the event loop's signal handler cannot be read" in caplog.text


def test_signal_after_loop_closed(plain_server: ServerHandler) -> None:
    """Left hooked when the loop is gone (lifespan off, no shutdown): the server decides."""
    rt = runtime()
    asyncio.run(_install(rt))
    assert rt.signal_drain.hooked == ("SIGTERM", "SIGINT")

    os.kill(os.getpid(), signal.SIGTERM)

    assert plain_server.received == [signal.SIGTERM]
    rt.signal_drain.uninstall()
    assert signal.getsignal(signal.SIGTERM) is plain_server


async def test_lifespan_manager_warns_once(
    restored_signals: None, caplog: pytest.LogCaptureFixture
) -> None:
    """In-process (asgi-lifespan + httpx): no server handler, so the startup warns once."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    rt = runtime()
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("ok"))])
    rt.install(app)
    with caplog.at_level(logging.WARNING, logger="forgezero_lifecycle.signals"):
        async with LifespanManager(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
                assert (await client.get("/")).status_code == 200
            hooked = rt.signal_drain.hooked

    assert hooked == ()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert [r.getMessage()[:40] for r in caplog.records] == [
        "signal.unhookable: SIGTERM cannot be hoo"
    ]


async def test_no_hook_outside_main_thread(
    plain_server: ServerHandler, caplog: pytest.LogCaptureFixture
) -> None:
    """signal.signal works in the main thread only: another thread's loop is not hooked."""
    rt = runtime()
    with caplog.at_level(logging.WARNING, logger="forgezero_lifecycle.signals"):
        thread = threading.Thread(target=asyncio.run, args=(_install(rt),))
        thread.start()
        thread.join(BOUND)

    assert rt.signal_drain.hooked == ()
    assert signal.getsignal(signal.SIGTERM) is plain_server
    assert "outside the main thread" in caplog.text


async def _install(rt: Runtime) -> None:
    rt.signal_drain.install()


async def test_uninstall_restores_handlers(
    plain_server: ServerHandler,
) -> None:
    """Lifespan shutdown (uninstall) and serve's seam (disable) leave the server's handlers."""
    rt = runtime()
    rt.signal_drain.install()
    rt.signal_drain.uninstall()
    assert signal.getsignal(signal.SIGTERM) is plain_server
    rt.signal_drain.install()  # a new lifespan hooks again
    assert rt.signal_drain.hooked == ("SIGTERM", "SIGINT")
    rt.signal_drain.disable()
    assert signal.getsignal(signal.SIGTERM) is plain_server
    rt.signal_drain.install()
    assert rt.signal_drain.hooked == ()


async def test_drain_on_signal_false(plain_server: ServerHandler) -> None:
    """With ``drain_on_signal=False`` nothing is ever hooked: the server keeps its handler."""
    rt = runtime(drain_on_signal=False)
    rt.signal_drain.install()
    assert rt.signal_drain.hooked == ()
    assert signal.getsignal(signal.SIGTERM) is plain_server


# Through the middleware: the lifespan scope installs, lifespan.shutdown puts back.


async def test_lifespan_hooks_and_restores(plain_server: ServerHandler) -> None:
    """Lifespan startup hooks SIGTERM and SIGINT; lifespan shutdown puts the server's back."""
    rt = runtime()
    during: list[tuple[str, ...]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "lifespan.startup"
        during.append(rt.signal_drain.hooked)
        await send({"type": "lifespan.startup.complete"})
        assert (await receive())["type"] == "lifespan.shutdown"
        during.append(rt.signal_drain.hooked)
        await send({"type": "lifespan.shutdown.complete"})

    recorder = ASGIRecorder({"type": "lifespan.startup"}, {"type": "lifespan.shutdown"})
    await rt.wrap(app)({"type": "lifespan"}, recorder.receive, recorder.send)

    assert during == [("SIGTERM", "SIGINT"), ()]
    assert signal.getsignal(signal.SIGTERM) is plain_server


async def test_first_request_hooks(plain_server: ServerHandler) -> None:
    """Without lifespan (an app that does not speak it, or a server run with lifespan off), the
    first request hooks."""
    rt = runtime()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            raise RuntimeError("no lifespan here")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    wrapped = rt.wrap(app)
    with pytest.raises(RuntimeError):
        await wrapped({"type": "lifespan"}, ASGIRecorder().receive, ASGIRecorder().send)
    assert rt.signal_drain.hooked == ()
    recorder = ASGIRecorder({"type": "http.request", "body": b""})
    scope = {"type": "http", "path": "/", "root_path": "", "method": "GET", "headers": []}
    await wrapped(scope, recorder.receive, recorder.send)
    assert rt.signal_drain.hooked == ("SIGTERM", "SIGINT")
    rt.signal_drain.uninstall()


# The request a signal stands for, and the options.


def test_self_drain_request_valid() -> None:
    """The request a signal stands for is a valid drain request: a fresh nonce each time, its
    timeout clamped to 100 ms .. 600 s."""
    first = parse_drain_request(self_drain_request(None, 30.0))
    second = parse_drain_request(self_drain_request(REVISION, 30.0))
    assert first.source_revision == UNKNOWN_REVISION == "0" * 40
    assert second.source_revision == REVISION
    assert first.nonce != second.nonce
    assert first.timeout_ms == 30_000
    assert parse_drain_request(self_drain_request(None, 0.001)).timeout_ms == 100
    assert parse_drain_request(self_drain_request(None, 10_000)).timeout_ms == 600_000


@pytest.mark.parametrize(
    "options",
    [
        {"drain_on_signal": "yes"},
        {"drain_on_signal": None},
        {"signal_drain_timeout": 0.05},
        {"signal_drain_timeout": 600.5},
        {"signal_drain_timeout": math.nan},
        {"signal_drain_timeout": math.inf},
        {"signal_drain_timeout": True},
        {"signal_drain_timeout": "30"},
    ],
)
def test_signal_options_checked(options: dict[str, Any]) -> None:
    """Bad signal options are refused with RUNTIME_CONFIG_INVALID when the runtime is built."""
    with pytest.raises(ConfigurationError) as error:
        runtime(**options)
    assert error.value.code == "RUNTIME_CONFIG_INVALID"
