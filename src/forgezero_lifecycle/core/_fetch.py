"""Fetch the handoff envelope: one GET, no redirects, a bounded streamed read, a strict body.

Port rules kept here (``tests/conformance/vectors.json`` ``meta.format_notes.port_rules``):

* D4: redirects are never followed; any status outside 200-299, 3xx included, fails
  ``RUNTIME_STATE_SOURCE_HTTP_<status>`` after exactly one request.
* D5/D8: the body is read as it arrives and counted *after* content decoding (``gzip``,
  ``x-gzip`` and ``deflate`` are decoded here with a bounded output size, so a compression bomb
  never inflates past the limit); reading stops as soon as more than ``limit`` bytes arrived, and
  a ``Content-Length`` announcing more fails before the body is read:
  ``RUNTIME_STATE_SOURCE_TOO_LARGE``.
* D6: strict UTF-8, strict JSON, an object at the top level: :mod:`._document`, which reads the
  body :func:`fetch_body` returns (:func:`fetch_document` does both).
* D7: refused, reset or truncated connections are ``RUNTIME_STATE_SOURCE_UNREACHABLE``; the
  caller owns the deadline (``RUNTIME_STATE_TIMEOUT``).
"""

from __future__ import annotations

import contextlib
import importlib
import re
import zlib
from typing import Any, Final

from .._errors import StateTransferFailedError
from ._document import parse_document
from ._httpx import httpx

__all__ = ["fetch_body", "fetch_document", "loopback_transport", "parse_document"]

_LENGTH: Final = re.compile(r"[0-9]+")
#: What ``localhost`` is connected as, in this order.
_LOCALHOST_LITERALS: Final = ("127.0.0.1", "::1")


def loopback_transport() -> httpx.AsyncBaseTransport:
    """The transport of a handoff fetch: plain http to loopback, so no CA bundle is loaded.

    ``localhost`` is never looked up: the system resolver (``/etc/hosts``, NSS) could map it
    anywhere, and the token would go there. It is connected as ``127.0.0.1``, then as
    ``[::1]`` when nothing listens there; the request still says ``Host: localhost[:port]``.

    httpx's transport runs on anyio, which imports its asyncio backend on the first request
    (about 20 ms in a fresh process, the new generation's case): that import is done here, when
    the controller is built at start-up, instead of inside the first handoff's deadline.
    """
    transport = _LiteralLocalhost(httpx.AsyncHTTPTransport(verify=False))
    with contextlib.suppress(ImportError):  # a private module path of anyio; only a warm-up
        importlib.import_module("anyio._backends._asyncio")
    return transport


class _LiteralLocalhost(httpx.AsyncBaseTransport):
    """Sends a request for ``localhost`` to the loopback literals, never through a resolver."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host != "localhost":
            return await self._inner.handle_async_request(request)
        *first, last = _LOCALHOST_LITERALS
        for literal in first:
            try:
                return await self._inner.handle_async_request(_to(request, literal))
            except httpx.ConnectError:
                pass  # not connected, so nothing was sent: try the next literal
        return await self._inner.handle_async_request(_to(request, last))

    async def aclose(self) -> None:
        await self._inner.aclose()


def _to(request: httpx.Request, literal: str) -> httpx.Request:
    """``request`` sent to ``literal``; its headers (Host: localhost[:port]) stay as they are."""
    return httpx.Request(
        request.method,
        request.url.copy_with(host=literal),
        headers=request.headers,
        stream=request.stream,
    )


async def fetch_document(
    url: str, authorization: str, *, transport: httpx.AsyncBaseTransport | None, limit: int
) -> dict[str, Any]:
    """GET ``url`` with ``Authorization`` and return the envelope as a parsed JSON object."""
    return parse_document(await fetch_body(url, authorization, transport=transport, limit=limit))


async def fetch_body(
    url: str, authorization: str, *, transport: httpx.AsyncBaseTransport | None, limit: int
) -> bytes:
    """GET ``url`` with ``Authorization`` and return the decoded body, at most ``limit`` bytes."""
    # Only the Authorization header is set, as the JavaScript `@forgezero/runtime` lifecycle module
    # does; httpx adds Host. No client defaults (Accept-Encoding, User-Agent...) since the request
    # is built directly.
    request = httpx.Request("GET", url, headers={"Authorization": authorization})
    try:
        # trust_env=False: no proxy or netrc from the environment for a loopback fetch.
        async with httpx.AsyncClient(
            transport=transport, follow_redirects=False, trust_env=False, timeout=None
        ) as client:
            response = await client.send(request, stream=True, follow_redirects=False)
            try:
                body = await _read_body(response, limit)
            finally:
                await response.aclose()
    except httpx.TimeoutException:
        raise StateTransferFailedError("RUNTIME_STATE_TIMEOUT") from None
    except (httpx.TransportError, OSError):
        raise StateTransferFailedError("RUNTIME_STATE_SOURCE_UNREACHABLE") from None
    return body


async def _read_body(response: httpx.Response, limit: int) -> bytes:
    if not 200 <= response.status_code <= 299:
        raise StateTransferFailedError(f"RUNTIME_STATE_SOURCE_HTTP_{response.status_code}")
    announced = response.headers.get("content-length", "")
    if _LENGTH.fullmatch(announced) and int(announced) > limit:
        raise StateTransferFailedError("RUNTIME_STATE_SOURCE_TOO_LARGE")
    decoders = [_Inflater(c) for c in _codings(response.headers.get_list("content-encoding"))]
    body = bytearray()
    async for raw in response.aiter_raw():
        chunk = raw
        for decoder in decoders:
            chunk = decoder.feed(chunk, limit - len(body))
        body += chunk
        if len(body) > limit:
            raise StateTransferFailedError("RUNTIME_STATE_SOURCE_TOO_LARGE")
    if not all(decoder.finished for decoder in decoders):
        raise StateTransferFailedError("RUNTIME_STATE_ENVELOPE_INVALID")
    return bytes(body)


def _codings(values: list[str]) -> list[str]:
    """The codings to undo, outermost first; unknown ones stop decoding (the body stays raw)."""
    applied = [c.strip().lower() for v in values for c in v.split(",") if c.strip()]
    applied = [c for c in applied if c != "identity"]
    if any(c not in ("gzip", "x-gzip", "deflate") for c in applied):
        return []
    return applied[::-1]


class _Inflater:
    """zlib decoding whose output never exceeds what the caller still has room for (+1 byte)."""

    def __init__(self, coding: str) -> None:
        self._gzip = coding != "deflate"
        self._raw_fallback = not self._gzip
        self._z = self._new(16 + zlib.MAX_WBITS if self._gzip else zlib.MAX_WBITS)

    @staticmethod
    def _new(wbits: int) -> Any:
        return zlib.decompressobj(wbits)

    @property
    def finished(self) -> bool:
        return bool(self._z.eof)

    def feed(self, data: bytes, room: int) -> bytes:
        out = bytearray()
        while data and len(out) <= room:
            try:
                out += self._z.decompress(data, room + 1 - len(out))
            except zlib.error:
                if not self._raw_fallback:
                    raise StateTransferFailedError("RUNTIME_STATE_ENVELOPE_INVALID") from None
                # "deflate" without the zlib wrapper, as some servers send it.
                self._raw_fallback = False
                self._z = self._new(-zlib.MAX_WBITS)
                continue
            self._raw_fallback = False
            if self._z.eof and self._gzip and self._z.unused_data:
                data = self._z.unused_data  # the next gzip member
                self._z = self._new(16 + zlib.MAX_WBITS)
            else:
                data = self._z.unconsumed_tail
        return bytes(out)
