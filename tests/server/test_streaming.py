"""Streaming responses across a drain, over real sockets, under every server kind.

The test app's stream never looks at the drain itself: what ends it is the middleware's
``http.disconnect`` after the stream grace, which Starlette's ``StreamingResponse`` listens for
(every server here announces ASGI spec 2.3 or older for HTTP, so Starlette runs its disconnect
listener), and the middleware then sends the empty last chunk the app left unsent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from ._control import ControlClient
from .conftest import ServerLog

pytestmark = [pytest.mark.server, pytest.mark.anyio]


async def test_stream_admitted_before_drain_completes_within_the_grace(
    http: httpx.AsyncClient, control: ControlClient
) -> None:
    """A stream that ends within the stream grace delivers every chunk and ends cleanly."""
    async with http.stream("GET", "/stream", params={"chunks": 4, "interval": 0.03}) as response:
        chunks = response.aiter_lines()
        first = await anext(chunks)
        nonce = await control.begin()
        rest = [line async for line in chunks]

    assert response.status_code == 200
    assert [first, *rest] == [f"chunk {index}" for index in range(4)]
    status = await control.wait_for_status(nonce, "drained", "failed")
    assert status["status"] == "drained"


async def test_stream_still_running_after_the_grace_is_ended_cleanly(
    http: httpx.AsyncClient, control: ControlClient
) -> None:
    """After the stream grace a long stream is cut short with a proper last chunk, not an error."""
    async with http.stream("GET", "/stream", params={"chunks": 200, "interval": 0.05}) as response:
        chunks = response.aiter_lines()
        first = await anext(chunks)
        nonce = await control.begin()
        rest = [line async for line in chunks]  # a truncated chunked body would raise here

    lines = [first, *rest]
    assert response.status_code == 200
    assert response.headers["transfer-encoding"] == "chunked"
    assert 1 <= len(lines) < 200
    assert lines == [f"chunk {index}" for index in range(len(lines))]
    status = await control.wait_for_status(nonce, "drained", "failed")
    assert status["status"] == "drained"
    assert status["inFlight"]["http"] == 0


async def test_length_delimited_stream_after_the_grace_is_cut_without_an_app_error(
    http: httpx.AsyncClient, control: ControlClient, server_log: ServerLog
) -> None:
    """A stream with a declared Content-Length cannot end cleanly early: the connection is cut,
    and no exception escapes into the server."""
    async with http.stream(
        "GET", "/stream", params={"chunks": 200, "interval": 0.05, "length": 1}
    ) as response:
        chunks = response.aiter_lines()
        await anext(chunks)
        nonce = await control.begin()
        with pytest.raises(httpx.RemoteProtocolError):  # the body is shorter than declared
            await _rest(chunks)

    assert (await control.wait_for_status(nonce, "drained", "failed"))["status"] == "drained"
    log = server_log.take()
    assert "Traceback" not in log, log


async def _rest(lines: AsyncIterator[str]) -> list[str]:
    return [line async for line in lines]
