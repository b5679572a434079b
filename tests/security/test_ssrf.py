"""Handoff SSRF: the new generation fetches state only from loopback ``http``, never elsewhere.

Through the control plane (``POST /.forgezero/runtime/state/v1/begin``, in process): any source
URL that does not serialise to ``http`` on ``127.0.0.1``, ``[::1]`` or ``localhost`` without
credentials or a fragment is refused with 400 ``RUNTIME_STATE_SOURCE_INVALID`` before anything
is fetched, and no handoff starts. A loopback source that answers with a redirect, to anywhere,
is never followed: one request, then ``RUNTIME_STATE_SOURCE_HTTP_<status>``.

Numeric spellings of 127.0.0.1 (``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``127.1``) are
loopback by the WHATWG URL rules the JavaScript `@forgezero/runtime` lifecycle module uses
(conformance vectors): they are accepted, and the request goes to 127.0.0.1 itself, never through a
resolver. The same spellings of any other address, and IPv4-mapped IPv6 forms even of 127.0.0.1, are
refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import httpx
import pytest

from forgezero_lifecycle.wire import paths

from ._asgi import CONTROL_TOKEN, HANDOFF_TOKEN, REVISION, NoteState, make_runtime

pytestmark = pytest.mark.anyio

AUTH: Final = {"authorization": f"Bearer {CONTROL_TOKEN}"}
NONCE: Final = "S" * 43

REFUSED: Final = {
    # not loopback
    "private-ipv4": "http://10.0.0.1/export",
    "metadata-service": "http://169.254.169.254/latest/meta-data/",
    "public-name": "http://example.com/export",
    "unspecified": "http://0.0.0.0/export",
    "other-loopback-address": "http://127.0.0.2/export",
    "ipv6-unspecified": "http://[::]/export",
    "ipv6-link-local": "http://[fe80::1]/export",
    "loopback-looking-name": "http://localhost.localdomain/export",
    "resolves-to-loopback": "http://127.0.0.1.nip.io/export",
    "localhost-subdomain": "http://evil.localhost/export",
    # not http
    "https": "https://127.0.0.1/export",
    "https-localhost": "https://localhost/export",
    "ftp": "ftp://127.0.0.1/export",
    "file": "file:///etc/passwd",
    "gopher": "gopher://127.0.0.1:6379/_FLUSHALL",
    "websocket": "ws://127.0.0.1/export",
    "no-scheme": "//127.0.0.1/export",
    # credentials
    "user-and-password": "http://user:pass@127.0.0.1/export",
    "user-only": "http://user@127.0.0.1/export",
    "password-only": "http://:pass@127.0.0.1/export",
    "loopback-as-user": "http://127.0.0.1@example.com/export",
    "loopback-as-user-and-port": "http://127.0.0.1:80@example.com/export",
    "encoded-at": "http://a%40b@127.0.0.1/export",
    # fragments
    "fragment": "http://127.0.0.1/export#x",
    "fragment-hiding-host": "http://127.0.0.1#@example.com/",
    # numeric forms of other addresses
    "decimal-metadata": "http://2852039166/",
    "hex-metadata": "http://0xa9fea9fe/",
    "octal-metadata": "http://0251.0376.0251.0376/",
    "hex-private": "http://0x0a000001/",
    "decimal-other-loopback": "http://2130706434/",
    "hex-other-loopback": "http://0x7f000002/",
    "octal-other-loopback": "http://0177.0.0.02/",
    "zero": "http://0/",
    # IPv4-mapped and -compatible IPv6
    "mapped-loopback": "http://[::ffff:127.0.0.1]/export",
    "mapped-loopback-hex": "http://[::ffff:7f00:1]/export",
    "mapped-long-form": "http://[0:0:0:0:0:ffff:127.0.0.1]/export",
    "compatible-loopback": "http://[::127.0.0.1]/export",
    "mapped-metadata": "http://[::ffff:a9fe:a9fe]/export",
    # a trailing dot is another name
    "localhost-dot": "http://localhost./export",
    "localhost-dot-upper": "http://LOCALHOST./export",
    "localhost-dot-port": "http://localhost.:8080/export",
    # odd spellings that hide another host
    "backslash-userinfo": "http://example.com\\@127.0.0.1/",
    "nul-in-host": "http://localhost%00.example.com/",
    "encoded-dot": "http://localhost%2e/",
    "fullwidth-dot": "http://localhost\uff0e/",
    "zone-id": "http://[::1%25lo]/",
}


def _begin_body(url: str) -> dict[str, Any]:
    return {
        "protocol": "tests.security.note",
        "nonce": NONCE,
        "schemaVersion": 1,
        "sourceRevision": REVISION,
        "targetRevision": "d" * 40,
        "source": {"url": url, "authorization": f"Bearer {HANDOFF_TOKEN}"},
        "timeoutMs": 3000,
    }


@pytest.mark.parametrize("url", REFUSED.values(), ids=REFUSED.keys())
async def test_remote_source_refused(url: str) -> None:
    """400 RUNTIME_STATE_SOURCE_INVALID, no handoff started, nothing imported."""
    note = NoteState()
    runtime, app = make_runtime(note)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        response = await http.post(
            paths.RUNTIME_STATE_BEGIN_PATH, json=_begin_body(url), headers=AUTH
        )
        status = await http.get(
            paths.RUNTIME_STATE_STATUS_PATH, params={"nonce": NONCE}, headers=AUTH
        )
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "RUNTIME_STATE_SOURCE_INVALID"
    assert url not in response.text
    assert status.status_code == 404
    assert note.imported is None
    await runtime.aclose()


class _Source:
    """A loopback HTTP source that answers every request with one canned response."""

    def __init__(self, response: bytes) -> None:
        self.response = response
        self.requests: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            self.requests.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(self.response)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def _listening(source: _Source) -> AsyncIterator[int]:
    server = await asyncio.start_server(source.handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def _handoff(url: str) -> tuple[dict[str, Any], NoteState]:
    note = NoteState()
    runtime, app = make_runtime(note)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        response = await http.post(
            paths.RUNTIME_STATE_BEGIN_PATH, json=_begin_body(url), headers=AUTH
        )
        assert response.status_code == 202, response.text
        assert runtime.handoff is not None
        await asyncio.wait_for(runtime.handoff.wait(NONCE), 10)
        status = await http.get(
            paths.RUNTIME_STATE_STATUS_PATH, params={"nonce": NONCE}, headers=AUTH
        )
    await runtime.aclose()
    result: dict[str, Any] = status.json()
    return result, note


REDIRECT_TARGETS: Final = {
    "loopback-canary": "http://127.0.0.1:{canary}/export",
    "metadata-service": "http://169.254.169.254/latest/meta-data/",
    "https-loopback": "https://127.0.0.1:{canary}/export",
    "relative": "/elsewhere",
    "itself": "http://127.0.0.1:{source}/export",
}


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("target", REDIRECT_TARGETS.values(), ids=REDIRECT_TARGETS.keys())
async def test_redirect_not_followed(status: int, target: str) -> None:
    """Any 3xx ends the handoff failed with its status after exactly one request."""
    canary = _Source(b"HTTP/1.1 500 Boom\r\nContent-Length: 0\r\n\r\n")
    async with _listening(canary) as canary_port:
        source = _Source(b"")
        async with _listening(source) as source_port:
            location = target.format(canary=canary_port, source=source_port)
            source.response = (
                f"HTTP/1.1 {status} Moved\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n"
            ).encode()
            result, note = await _handoff(f"http://127.0.0.1:{source_port}/export")
    assert result["status"] == "failed"
    assert result["failure"] == f"RUNTIME_STATE_SOURCE_HTTP_{status}"
    assert len(source.requests) == 1
    assert canary.requests == []
    assert note.imported is None


@pytest.mark.parametrize(
    "host", ["2130706433", "0x7f000001", "0177.0.0.1", "127.1", "0x7f.1", "127.0.0.1."]
)
async def test_numeric_loopback_spelling(host: str) -> None:
    """The WHATWG-normalised address is what is fetched: Host says 127.0.0.1, no resolver."""
    source = _Source(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
    async with _listening(source) as port:
        result, note = await _handoff(f"http://{host}:{port}/export")
    assert result["failure"] == "RUNTIME_STATE_SOURCE_HTTP_404"
    assert len(source.requests) == 1
    assert f"host: 127.0.0.1:{port}".encode() in source.requests[0].lower()
    assert note.imported is None
