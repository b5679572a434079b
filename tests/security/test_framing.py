"""Request smuggling and odd framing through real uvicorn: a drained generation admits nothing.

Raw sockets to uvicorn (h11 and httptools) running the reliability app, whose every admitted
request is recorded by the app itself. Once the generation is drained, no framing trick (CL.TE,
TE.CL, obfuscated Transfer-Encoding, duplicate or odd Content-Length, bad chunk sizes, huge
headers and URLs, pipelining, Expect: 100-continue, bare LF, HTTP/1.0 and 0.9, absolute form)
gets a request, outer or smuggled, admitted: no 2xx comes back, the app records no request, the
drain status stays drained with zero in flight.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Final

import pytest

from tests.reliability._fleet import Fleet, Generation
from tests.reliability._soak import report

pytestmark = [pytest.mark.server, pytest.mark.anyio]

STATUS_LINE: Final = re.compile(rb"HTTP/1\.[01] (\d{3})")
READ_IDLE: Final = 2.0


def _smuggled(name: str) -> bytes:
    return f"GET /fast HTTP/1.1\r\nHost: x\r\nx-request-id: smuggled-{name}\r\n\r\n".encode()


def _post(name: str, headers: str, body: bytes) -> bytes:
    head = f"POST /submit HTTP/1.1\r\nHost: x\r\nx-request-id: outer-{name}\r\n{headers}\r\n"
    return head.encode() + body


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _payloads() -> dict[str, bytes]:
    built: dict[str, Callable[[str], bytes]] = {
        "cl-te": lambda n: _post(
            n,
            f"Content-Length: {5 + len(_smuggled(n))}\r\nTransfer-Encoding: chunked\r\n",
            b"0\r\n\r\n" + _smuggled(n),
        ),
        "te-cl": lambda n: _post(
            n,
            "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n",
            _chunk(_smuggled(n)) + b"0\r\n\r\n",
        ),
        "te-te": lambda n: _post(
            n,
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: cow\r\n",
            b"0\r\n\r\n" + _smuggled(n),
        ),
        "te-space-before-colon": lambda n: _post(
            n, "Transfer-Encoding : chunked\r\nContent-Length: 5\r\n", b"0\r\n\r\n" + _smuggled(n)
        ),
        "te-xchunked": lambda n: _post(
            n, "Transfer-Encoding: xchunked\r\n", b"0\r\n\r\n" + _smuggled(n)
        ),
        "te-chunked-identity": lambda n: _post(
            n, "Transfer-Encoding: chunked, identity\r\n", b"0\r\n\r\n" + _smuggled(n)
        ),
        "te-tab": lambda n: _post(
            n, "Transfer-Encoding:\tchunked\r\n", b"0\r\n\r\n" + _smuggled(n)
        ),
        "te-folded": lambda n: _post(
            n, "Transfer-Encoding:\r\n chunked\r\n", b"0\r\n\r\n" + _smuggled(n)
        ),
        "duplicate-cl": lambda n: _post(
            n, f"Content-Length: 0\r\nContent-Length: {len(_smuggled(n))}\r\n", _smuggled(n)
        ),
        "cl-list": lambda n: _post(n, f"Content-Length: 0, {len(_smuggled(n))}\r\n", _smuggled(n)),
        "negative-cl": lambda n: _post(n, "Content-Length: -1\r\n", _smuggled(n)),
        "plus-cl": lambda n: _post(n, "Content-Length: +0\r\n", _smuggled(n)),
        "hex-cl": lambda n: _post(n, "Content-Length: 0x0\r\n", _smuggled(n)),
        "huge-cl": lambda n: _post(n, "Content-Length: 99999999999999999999999\r\n", b"x"),
        "bad-chunk-size": lambda n: _post(
            n, "Transfer-Encoding: chunked\r\n", b"zz\r\nxx\r\n0\r\n\r\n" + _smuggled(n)
        ),
        "chunk-size-overflow": lambda n: _post(
            n, "Transfer-Encoding: chunked\r\n", b"ffffffffffffffffffffff\r\nx\r\n0\r\n\r\n"
        ),
        "long-chunk-extension": lambda n: _post(
            n, "Transfer-Encoding: chunked\r\n", b"1;e=" + b"a" * 70_000 + b"\r\nx\r\n0\r\n\r\n"
        ),
        "long-header": lambda n: _post(
            n, "X-Long: " + "a" * 70_000 + "\r\nContent-Length: 0\r\n", b""
        ),
        "many-headers": lambda n: _post(
            n, "".join(f"X-H{i}: {i}\r\n" for i in range(2000)) + "Content-Length: 0\r\n", b""
        ),
        "long-url": lambda n: (
            f"GET /fast?{'a' * 70_000} HTTP/1.1\r\nHost: x\r\nx-request-id: outer-{n}\r\n\r\n"
        ).encode(),
        "pipelined": lambda n: _smuggled(n) + _smuggled(n + "-2") + _smuggled(n + "-3"),
        "expect-continue": lambda n: _post(
            n, "Expect: 100-continue\r\nContent-Length: 10\r\n", b""
        ),
        "get-with-body": lambda n: (
            (
                f"GET /fast HTTP/1.1\r\nHost: x\r\nx-request-id: outer-{n}\r\n"
                f"Content-Length: {len(_smuggled(n))}\r\n\r\n"
            ).encode()
            + _smuggled(n)
        ),
        "http10": lambda n: f"GET /fast HTTP/1.0\r\nx-request-id: outer-{n}\r\n\r\n".encode(),
        "http09": lambda n: b"GET /fast\r\n\r\n",
        "absolute-form": lambda n: (
            f"GET http://127.0.0.1/fast HTTP/1.1\r\nHost: x\r\nx-request-id: outer-{n}\r\n\r\n"
        ).encode(),
        "bare-lf": lambda n: f"GET /fast HTTP/1.1\nHost: x\nx-request-id: outer-{n}\n\n".encode(),
        "nul-in-header": lambda n: _post(n, "X-A: a\x00b\r\nContent-Length: 0\r\n", b""),
        "space-in-header-name": lambda n: _post(n, "X A: b\r\nContent-Length: 0\r\n", b""),
        "websocket-upgrade": lambda n: (
            (
                f"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                f"x-request-id: outer-{n}\r\n\r\n"
            ).encode()
            + _smuggled(n)
        ),
        "h2c-upgrade": lambda n: (
            f"GET /fast HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            f"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nx-request-id: outer-{n}\r\n\r\n"
        ).encode(),
    }
    return {name: make(name) for name, make in built.items()}


PAYLOADS: Final = _payloads()


async def _exchange(generation: Generation, payload: bytes) -> list[int]:
    """Send ``payload`` on a fresh connection; return the status codes of what comes back."""
    host, port = generation.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    received = b""
    try:
        writer.write(payload)
        await writer.drain()
        while True:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), READ_IDLE)
            except TimeoutError:
                break
            if not chunk:
                break
            received += chunk
    except ConnectionError:
        pass  # a reset is an answer too: nothing was admitted on it
    finally:
        writer.close()
    return [int(code) for code in STATUS_LINE.findall(received)]


@pytest.mark.parametrize("kind", ["uvicorn-h11", "uvicorn-httptools"])
@pytest.mark.timeout(60)
async def test_no_framing_trick_admits(fleet: Fleet, kind: str) -> None:
    """Smuggled or oddly framed requests to a drained uvicorn: never a 2xx, never admitted."""
    generation = await fleet.start(f"f-{kind}", kind=kind)
    nonce = await generation.begin_drain()
    assert (await generation.control.wait_for_status(nonce, "drained"))["status"] == "drained"

    names = list(PAYLOADS)
    answers = await asyncio.gather(*(_exchange(generation, PAYLOADS[name]) for name in names))
    outcomes = dict(zip(names, answers, strict=True))

    status = await generation.control.status(nonce)
    records = generation.records()
    admitted = {
        name: codes for name, codes in outcomes.items() if any(200 <= c < 300 for c in codes)
    }
    assert admitted == {}
    assert dict(records.started) == {}
    assert status["status"] == "drained"
    assert status["inFlight"] == {"http": 0, "websocket": 0, "jobs": 0, "schedules": 0}
    assert all(
        code in (400, 413, 414, 431, 501, 503, 505) for codes in answers for code in codes
    ), outcomes
    refused = sum(codes.count(503) for codes in answers)
    report(
        "framing-during-drain", server=kind, payloads=len(PAYLOADS), answers=outcomes, admitted=0
    )
    assert refused > 0
    assert generation.log_problems() == []


@pytest.mark.timeout(60)
async def test_hang_up_leaves_no_error(
    fleet: Fleet,
) -> None:
    """A control request whose client disconnects mid-body is not an internal error."""
    from tests.real_servers._control import CONTROL_TOKEN

    generation = await fleet.start("f-hangup", kind="uvicorn-h11")
    host, port = generation.url.removeprefix("http://").split(":")
    _reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /.forgezero/runtime/drain/v1/begin HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer " + CONTROL_TOKEN.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n" + b'{"nonce":'
    )
    await writer.drain()
    await asyncio.sleep(0.3)
    writer.close()
    await asyncio.sleep(0.5)
    assert await generation.control.ready() == 200
    assert generation.log_problems() == []
