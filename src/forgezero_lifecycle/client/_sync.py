"""The blocking facade: :class:`ControlClient`'s calls, each run on a private event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Self, TypeVar, final

from ..wire.drain import DrainStatus
from ..wire.handoff import StateHandoffStatus
from ._client import ControlClient

__all__ = ["SyncControlClient"]

T = TypeVar("T")
P = ParamSpec("P")


def _blocking(
    method: Callable[Concatenate[ControlClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[SyncControlClient, P], T]:
    """The blocking twin of a :class:`ControlClient` method, same signature and types."""

    def call(self: SyncControlClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._runner.run(method(self._client, *args, **kwargs))

    call.__name__ = method.__name__
    call.__doc__ = method.__doc__
    return call


@final
class SyncControlClient:
    """A blocking facade for scripts: the same calls, run on a private event loop.

    Use it as a context manager, outside any running event loop. ``on_progress`` callbacks run
    on the calling thread; the waits take a ``timeout`` (seconds, :class:`TimeoutError`).
    """

    def __init__(self, url: str, **options: Any) -> None:
        self._runner = asyncio.Runner()
        self._client = ControlClient(url, **options)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._runner.run(self._client.aclose())
        finally:
            self._runner.close()

    begin_drain = _blocking(ControlClient.begin_drain)
    drain_status = _blocking(ControlClient.drain_status)
    current_drain = _blocking(ControlClient.current_drain)
    rollback = _blocking(ControlClient.rollback)
    reload = _blocking(ControlClient.reload)
    export_state = _blocking(ControlClient.export_state)
    begin_handoff = _blocking(ControlClient.begin_handoff)
    handoff_status = _blocking(ControlClient.handoff_status)
    ready = _blocking(ControlClient.ready)
    live = _blocking(ControlClient.live)

    def wait_drained(
        self, nonce: str, *, timeout: float | None = None, **options: Any
    ) -> DrainStatus:
        return self._runner.run(_within(timeout, self._client.wait_drained(nonce, **options)))

    def wait_handoff(
        self, nonce: str, *, timeout: float | None = None, **options: Any
    ) -> StateHandoffStatus:
        return self._runner.run(_within(timeout, self._client.wait_handoff(nonce, **options)))


async def _within(seconds: float | None, coroutine: Coroutine[Any, Any, T]) -> T:
    async with asyncio.timeout(seconds):
        return await coroutine
