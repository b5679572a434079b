"""The bounded teardown, in process: the app's lifespan shutdown right after the drain, within
what is left of the deadline plus the teardown margin, and the server's own shutdown answered
with what the app answered (complete, or failed when it failed or overran)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette

from forgezero_lifecycle import ConfigurationError
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.testing import ManualClock, settle
from tests.test_runtime import TOKEN, drain_request

pytestmark = pytest.mark.anyio

Message = dict[str, Any]


class Server:
    """The lifespan side of a server: a queue to the app, a record of what it sends."""

    def __init__(self, app: Any) -> None:
        self.queue: asyncio.Queue[Message] = asyncio.Queue()
        self.sent: list[str] = []
        self.started = asyncio.Event()
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self.task = asyncio.ensure_future(app(scope, self.queue.get, self._send))

    async def _send(self, message: Message) -> None:
        self.sent.append(message["type"])
        if message["type"] == "lifespan.startup.complete":
            self.started.set()

    async def start(self) -> None:
        await self.queue.put({"type": "lifespan.startup"})
        await asyncio.wait_for(self.started.wait(), 5)

    async def shut_down(self) -> list[str]:
        await self.queue.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(self.task, 5)
        return self.sent


def app_with(shutdown: Any, events: list[str]) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        events.append("shutdown begins")
        await shutdown()
        events.append("shutdown ends")

    return Starlette(lifespan=lifespan)


async def drained(runtime: Runtime) -> None:
    runtime.drain.begin(drain_request(timeout_ms=2000))
    assert await runtime.drain.wait() == "drained"


async def test_shutdown_after_drain_before_server_stop() -> None:
    """teardown() runs the app's shutdown once the drain settled, before the server's own
    lifespan.shutdown, which is then answered complete at once."""
    events: list[str] = []

    async def nothing() -> None:
        pass

    app = app_with(nothing, events)
    runtime = Runtime(control_token=TOKEN, drain_on_signal=False)
    runtime.install(app)
    server = Server(app)
    await server.start()
    await drained(runtime)
    assert events == []
    assert await runtime.teardown()
    assert events == ["shutdown begins", "shutdown ends"]
    assert server.sent == ["lifespan.startup.complete"]  # the app's answer is kept for later
    assert await server.shut_down() == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert events == ["shutdown begins", "shutdown ends"]  # run once
    assert not runtime.teardown_failed


async def test_hung_shutdown_bounded(caplog: pytest.LogCaptureFixture) -> None:
    """A shutdown that hangs past what is left of the deadline plus the margin is logged and
    cancelled, teardown() returns False, and the server's shutdown is answered failed."""
    clock = ManualClock()
    events: list[str] = []
    hang = asyncio.Event()
    app = app_with(hang.wait, events)
    runtime = Runtime(control_token=TOKEN, clock=clock, drain_on_signal=False, teardown_margin=1.0)
    runtime.install(app)
    server = Server(app)
    await server.start()
    await drained(runtime)  # at once: 2 s of its deadline left
    with caplog.at_level(logging.INFO, logger="forgezero_lifecycle.teardown"):
        teardown = asyncio.ensure_future(runtime.teardown())
        await settle()
        await clock.advance(2.9)
        assert not teardown.done()
        await clock.advance(0.2)  # 2 s left + 1 s margin: over
        assert await teardown is False
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "teardown.lifespan_shutdown bound_s=3.000",
        "teardown.lifespan_overran bound_s=3.000",
    ]
    assert events == ["shutdown begins"]
    assert runtime.teardown_failed
    assert await server.shut_down() == ["lifespan.startup.complete", "lifespan.shutdown.failed"]


async def test_failed_shutdown_answered_failed() -> None:
    """An app that fails its shutdown: the server is answered failed with its message."""
    runtime = Runtime(control_token=TOKEN, drain_on_signal=False)
    answers: list[Message] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "lifespan.startup"
        await send({"type": "lifespan.startup.complete"})
        assert (await receive())["type"] == "lifespan.shutdown"
        await send({"type": "lifespan.shutdown.failed", "message": "the pool would not close"})

    wrapped = runtime.wrap(app)
    queue: asyncio.Queue[Message] = asyncio.Queue()

    async def send(message: Message) -> None:
        answers.append(message)

    lifespan = asyncio.ensure_future(wrapped({"type": "lifespan"}, queue.get, send))
    await queue.put({"type": "lifespan.startup"})
    await settle()
    await drained(runtime)
    assert not await runtime.teardown()
    await queue.put({"type": "lifespan.shutdown"})
    await lifespan
    assert answers[-1] == {
        "type": "lifespan.shutdown.failed",
        "message": "the pool would not close",
    }
    assert runtime.teardown_failed


async def test_without_drain_server_shutdown_untouched() -> None:
    """No drain, no teardown: the server's own shutdown reaches the app as without the runtime."""
    events: list[str] = []

    async def nothing() -> None:
        pass

    app = app_with(nothing, events)
    Runtime(control_token=TOKEN, drain_on_signal=False).install(app)
    server = Server(app)
    await server.start()
    assert await server.shut_down() == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert events == ["shutdown begins", "shutdown ends"]


@pytest.mark.parametrize("margin", [-1, True, "2", 601.0])
def test_unusable_margin_refused(margin: Any) -> None:
    """A teardown margin the stop could never use is refused when the runtime is built."""
    with pytest.raises(ConfigurationError, match="teardown_margin"):
        Runtime(control_token=TOKEN, teardown_margin=margin)
