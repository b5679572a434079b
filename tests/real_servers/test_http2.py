"""HTTP/2 across a drain, over a real socket: hypercorn serving cleartext HTTP/2 (prior knowledge).

``connection`` is a connection-specific header HTTP/2 forbids (RFC 9113, section 8.2.2): a
response the drain finds running must arrive intact and without it, where under HTTP/1.1 it
would say ``Connection: close``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from forgezero_lifecycle.core._httpx import tls_context

from ._control import WireControl
from ._servers import RunningServer
from .conftest import ServerLog, run_test_app

pytestmark = [pytest.mark.server, pytest.mark.anyio]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The test app under hypercorn, the one server here that speaks HTTP/2."""
    yield from run_test_app("hypercorn", "tests.real_servers.app:app", tmp_path_factory)


@pytest.fixture
async def http(server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP/2-only client: every request, the control plane's too, goes over HTTP/2."""
    async with httpx.AsyncClient(
        base_url=server.url, timeout=10.0, http1=False, http2=True, verify=tls_context()
    ) as client:
        yield client


@pytest.fixture
async def control(
    server: RunningServer, server_log: ServerLog, http: httpx.AsyncClient
) -> AsyncIterator[WireControl]:
    """The control client over HTTP/2; afterwards every drain it began is rolled back over a new
    connection: the drain sent every connection its final GOAWAY and closed it, and a request
    that races that close is never processed (a client sends it again on a new connection)."""
    client = WireControl(http)
    yield client
    async with httpx.AsyncClient(
        base_url=server.url, timeout=10.0, http1=False, http2=True, verify=tls_context()
    ) as fresh:
        client.http = fresh
        await client.reset()


async def test_h2_response_arrives_whole(http: httpx.AsyncClient, control: WireControl) -> None:
    """Admitted before the drain, answered after it began: status and body intact, no
    ``connection`` header, and the drain ends drained."""
    slow = asyncio.create_task(http.get("/slow", params={"seconds": 0.8}))
    await control.wait_admitted("http")
    nonce = await control.begin()
    finished = await slow

    assert finished.http_version == "HTTP/2"
    assert finished.status_code == 200
    assert finished.json() == {"slept": 0.8}
    assert "connection" not in finished.headers
    drained = await control.wait_for_status(nonce, "drained", "failed")
    assert drained["status"] == "drained"


async def test_h2_refusal_no_connection(http: httpx.AsyncClient, control: WireControl) -> None:
    """A refusal over HTTP/2 has no connection header: a request that arrives during the drain gets
    the 503 refusal, well formed for HTTP/2."""
    await control.begin()
    refused = await http.get("/fast")

    assert refused.http_version == "HTTP/2"
    assert refused.status_code == 503
    assert refused.json() == {"error": "RUNTIME_DRAINING"}
    assert refused.headers["retry-after"] == "1"
    assert "connection" not in refused.headers


async def test_h2_cut_stream_reset(http: httpx.AsyncClient, control: WireControl) -> None:
    """A stream the drain ends before its last part is reset (RST_STREAM), never ended
    cleanly: httpx raises instead of returning a short body as whole."""
    async with http.stream("GET", "/stream", params={"chunks": 200, "interval": 0.05}) as response:
        assert response.http_version == "HTTP/2"
        lines = response.aiter_lines()
        assert await anext(lines) == "chunk 0"
        nonce = await control.begin()
        with pytest.raises(httpx.RemoteProtocolError, match="StreamReset"):
            await _rest(lines)

    drained = await control.wait_for_status(nonce, "drained", "failed")
    assert drained["status"] == "drained"


async def _rest(lines: AsyncIterator[str]) -> list[str]:
    return [line async for line in lines]
