"""The blocking facade: :class:`ControlClient`'s calls, each run on a private event loop."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Self, TypeVar, final

import httpx

from ..wire.drain import DrainStatus
from ..wire.handoff import StateHandoffStatus
from ..wire.supervisor import HandoverStatus
from ._client import DEFAULT_POLL_INTERVAL, DEFAULT_RETRIES, DEFAULT_TIMEOUT, ControlClient

__all__ = ["SyncControlClient"]

T = TypeVar("T")
P = ParamSpec("P")


def _blocking(
    method: Callable[Concatenate[ControlClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[SyncControlClient, P], T]:
    """The blocking twin of a :class:`ControlClient` method, same signature and types."""

    def call(self: SyncControlClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._runner.run(method(self._client, *args, **kwargs))

    functools.update_wrapper(call, method)  # name, docstring, and the signature for inspect
    call.__qualname__ = f"SyncControlClient.{method.__name__}"
    return call


@final
class SyncControlClient:
    """A blocking facade for scripts: the same calls, run on a private event loop.

    Use it as a context manager, outside any running event loop. The options are
    :class:`ControlClient`'s (``transport`` too is an async one: the calls run on the private
    loop). ``on_progress`` callbacks run on the calling thread; the waits take a ``timeout``
    (seconds, :class:`TimeoutError`).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        handoff_token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._runner = asyncio.Runner()
        self._client = ControlClient(
            url,
            token=token,
            handoff_token=handoff_token,
            timeout=timeout,
            retries=retries,
            transport=transport,
        )

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
    handover_status = _blocking(ControlClient.handover_status)
    export_state = _blocking(ControlClient.export_state)
    begin_handoff = _blocking(ControlClient.begin_handoff)
    handoff_status = _blocking(ControlClient.handoff_status)
    ready = _blocking(ControlClient.ready)
    live = _blocking(ControlClient.live)

    def wait_drained(
        self,
        nonce: str,
        *,
        on_progress: Callable[[DrainStatus], object] | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        timeout: float | None = None,
    ) -> DrainStatus:
        """Poll until the drain is drained, failed or rolled back; returns that status.

        ``on_progress`` sees every status polled, the final one included. After ``timeout``
        seconds (None: no bound) the wait raises :class:`TimeoutError`; the drain goes on.
        """
        waiting = self._client.wait_drained(
            nonce, on_progress=on_progress, poll_interval=poll_interval
        )
        return self._runner.run(_within(timeout, waiting))

    def wait_handoff(
        self,
        nonce: str,
        *,
        on_progress: Callable[[StateHandoffStatus], object] | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        timeout: float | None = None,
    ) -> StateHandoffStatus:
        """Poll until the handoff is acknowledged or failed (see :meth:`wait_drained`)."""
        waiting = self._client.wait_handoff(
            nonce, on_progress=on_progress, poll_interval=poll_interval
        )
        return self._runner.run(_within(timeout, waiting))

    def wait_handover(
        self,
        handover: int,
        *,
        on_progress: Callable[[HandoverStatus], object] | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        timeout: float | None = None,
    ) -> HandoverStatus:
        """Poll until the handover is done or aborted (see :meth:`wait_drained`)."""
        waiting = self._client.wait_handover(
            handover, on_progress=on_progress, poll_interval=poll_interval
        )
        return self._runner.run(_within(timeout, waiting))


async def _within(seconds: float | None, coroutine: Coroutine[Any, Any, T]) -> T:
    async with asyncio.timeout(seconds):
        return await coroutine
