"""InFlightMiddleware under a real hypercorn server in this process: raw bytes over loopback.

An HTTP/1 request admitted while serving gets hypercorn's own ``receive`` and ``send`` (nothing
wrapped); the drain must still reach it through hypercorn's ``HTTPStream``. Each test serves
its app with ``hypercorn.asyncio.serve`` in the test's own event loop and moves the gate by
hand, from inside the app or between the client's steps, so the moment the drain begins is
exact.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import h11
import httpx
import pytest

from forgezero_lifecycle import ConnectionClosedByDrainError
from forgezero_lifecycle.asgi import _hypercorn
from forgezero_lifecycle.asgi.middleware import InFlightMiddleware
from forgezero_lifecycle.core._httpx import tls_context
from forgezero_lifecycle.core.gate import IntakeGate
from forgezero_lifecycle.testing import settle
from tests.asgi._hypercorn_server import BOUND, Message, until

pytestmark = pytest.mark.anyio


async def _read_to_disconnect_then_answer(
    receive: Any, send: Any, read: list[Message], each: Callable[[], object] = lambda: None
) -> None:
    """An app's body: every message up to the disconnect into ``read`` (``each`` after every
    one), then a 200 ``done``."""
    while True:
        message = await receive()
        read.append(message)
        each()
        if message["type"] == "http.disconnect":
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"done"})


async def test_http1_gets_server_channels(hypercorn: Any) -> None:
    """Nothing is wrapped while no drain has begun: the app is handed hypercorn's stream's
    ``app_send`` and its app queue's ``get``, and the request is counted while it runs."""
    gate = IntakeGate()
    seen: list[Any] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        seen.extend([type(send.__self__).__name__, type(receive.__self__), gate.statistics().http])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    client = await served.connect()
    await client.request()
    assert (await client.head()).status_code == 200
    assert await client.rest() == b"ok"
    assert seen == ["HTTPStream", asyncio.Queue, 1]
    assert gate.statistics().http == 0


async def test_http2_wrapped_no_connection(
    hypercorn: Any,
) -> None:
    """An HTTP/2 stream shares its connection with others: it is wrapped, and a response it
    starts during a drain comes whole, without the ``connection`` header HTTP/2 forbids."""
    gate = IntakeGate()
    owners: list[str] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        owners.append(type(getattr(send, "__self__", None)).__name__)
        gate.begin_draining()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    async with httpx.AsyncClient(
        http1=False, http2=True, timeout=BOUND, verify=tls_context()
    ) as client:
        response = await client.get(served.url + "/")
    assert (response.http_version, response.status_code, response.content) == (
        "HTTP/2",
        200,
        b"ok",
    )
    assert "connection" not in response.headers
    assert owners == ["_HttpResponder"]


async def test_early_drain_closes(
    hypercorn: Any,
) -> None:
    """Admitted one step before the drain begins, the response still says Connection: close
    and the connection is closed after it."""
    gate = IntakeGate()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        gate.begin_draining()  # the first thing after admission, before any await
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    client = await served.connect()
    await client.request()
    head = await client.head()
    assert (b"connection", b"close") in head.headers
    assert await client.rest() == b"ok"
    assert await client.closed()


@pytest.mark.parametrize("waiting", [True, False], ids=["waiting-at-notice", "receive-later"])
async def test_receive_after_body_ends(hypercorn: Any, waiting: bool) -> None:
    """Whether the stream waits on receive() at the notice or calls it later, it gets
    http.disconnect, and the chunked response it leaves unfinished is cut so the client can
    tell: the connection ends without the terminating chunk."""
    gate = IntakeGate()
    later = asyncio.Event()
    got: list[Message] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        if not waiting:
            await later.wait()
        got.append(await receive())

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    client = await served.connect()
    await client.request()
    head = await client.head()
    assert (await client.event()).data == b"part"
    await settle()
    gate.close()
    gate.end_streams()
    later.set()
    with pytest.raises(h11.RemoteProtocolError):  # the body ends early: no last chunk
        await client.rest()
    assert got == [{"type": "http.disconnect"}]
    assert (b"connection", b"close") not in head.headers  # started before the drain
    assert gate.statistics().http == 0


async def test_late_body_read_whole(
    hypercorn: Any,
) -> None:
    """The disconnect follows the last part of the body into the app queue, never ahead of
    it: a request still uploading at the notice reads all it sends."""
    gate = IntakeGate()
    read: list[Message] = []
    first_part = asyncio.Event()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await _read_to_disconnect_then_answer(receive, send, read, each=first_part.set)

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    client = await served.connect()
    await client.request("POST", body=b"front", end=False)
    await asyncio.wait_for(first_part.wait(), BOUND)
    gate.close()
    gate.end_streams()
    await client.send_rest(b"back!")
    head = await client.head()
    assert await client.rest() == b"done"
    body = b"".join(message.get("body", b"") for message in read)
    assert body == b"frontback!"
    assert [m["type"] for m in read][-1] == "http.disconnect"
    assert [m.get("more_body") for m in read[:-1]][-1] is False
    assert (b"connection", b"close") in head.headers


async def test_full_queue_body_read_whole(
    hypercorn: Any,
) -> None:
    """A body that fills hypercorn's app queue, unread at the notice (its end waits for room
    in the queue): the app still reads every part, then the disconnect."""
    gate = IntakeGate()
    told = asyncio.Event()
    read: list[Message] = []
    parts = [b"%02d" % index for index in range(10)]  # the queue holds 10: the end waits

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await told.wait()
        await _read_to_disconnect_then_answer(receive, send, read)

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    client = await served.connect()
    chunked = b"".join(b"2\r\n" + part + b"\r\n" for part in parts) + b"0\r\n\r\n"
    head = b"POST / HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
    client.writer.write(head + chunked)
    await client.writer.drain()
    await until(lambda: gate.statistics().http == 1)
    await settle()
    gate.close()
    gate.end_streams()
    told.set()
    # The request went out as raw bytes: tell the client's h11 of it, to read the answer.
    client.h11.send(h11.Request(method="POST", target="/", headers=[("Host", "test")]))
    assert (await client.head()).status_code == 200
    assert await client.rest() == b"done"
    assert b"".join(m.get("body", b"") for m in read) == b"".join(parts)
    assert [m["type"] for m in read][-1] == "http.disconnect"
    assert read[-2]["more_body"] is False


async def test_answer_across_notice_whole(hypercorn: Any) -> None:
    """A request that read its body and does not wait on receive() is not told to stop."""
    gate = IntakeGate()
    ready = asyncio.Event()
    read = asyncio.Event()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        body = (await receive())["body"]
        read.set()
        await ready.wait()
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    client = await served.connect()
    await client.request("POST", body=b"payload")
    await asyncio.wait_for(read.wait(), BOUND)
    gate.close()
    gate.end_streams()
    ready.set()
    head = await client.head()
    assert (b"connection", b"close") in head.headers
    assert await client.rest() == b"payload"
    assert await client.closed()
    assert gate.statistics().http == 0


async def test_blocked_send_given_up(hypercorn: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The blocked send is let go, the next one raises ConnectionClosedByDrainError (an OSError),
    the app's error stays inside, the connection is aborted and the count released."""
    gate = IntakeGate()
    raised: list[BaseException] = []
    streams: list[Any] = []
    chunk = b"x" * 65536

    async def app(scope: Message, receive: Any, send: Any) -> None:
        streams.append(_stream_of(send))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            # Far more than the socket buffers hold; bounded, so a send that neither blocks nor
            # raises (a regression) ends the test instead of spinning forever.
            for _ in range(2000):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except OSError as error:
            raised.append(error)
            raise

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    client = await served.connect(receive_buffer=4096)
    await client.request()  # and never read

    def blocked() -> bool:  # hypercorn's writer waits for the client to read
        return bool(streams) and streams[0].send.__self__.send.__self__.writer._protocol._paused

    await until(blocked)
    gate.close()
    gate.end_streams()
    await settle()
    assert gate.statistics().http == 1
    with caplog.at_level(logging.WARNING):
        gate.cut_off()
        await until(lambda: gate.statistics().http == 0)
    assert [type(error) for error in raised] == [ConnectionClosedByDrainError]
    assert [r.getMessage() for r in caplog.records if r.name.startswith("forgezero")] == [
        "drain.connection_abandoned kind=http"
    ]
    assert streams[0].closed


def _stream_of(send: Any) -> Any:
    """The hypercorn stream behind the ``send`` an app was handed, wrapped or not."""
    owner = send.__self__
    if type(owner).__name__ == "_HttpResponder":
        owner = owner._send.__self__  # the wrapped path's own server send
    return owner


async def test_late_failure_answered(
    hypercorn: Any,
) -> None:
    """The disconnect told to the app is the middleware's: hypercorn still answers the app's
    failure with its 500 to the client, still there."""
    gate = IntakeGate()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await receive()
        if (await receive())["type"] == "http.disconnect":
            raise RuntimeError("the app's own failure after the notice")

    served = await hypercorn(InFlightMiddleware(app, gate=gate))
    client = await served.connect()
    await client.request()
    await settle()
    gate.close()
    gate.end_streams()
    assert (await client.head()).status_code == 500
    assert gate.statistics().http == 0


async def test_path_needs_all_uses(hypercorn: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hypercorn stream qualifies; one whose class lacks what a drain moment uses (as if it
    had been renamed) does not, and is served by the wrapped path."""
    monkeypatch.setattr(_hypercorn, "KNOWN_STREAMS", {})
    streams: list[Any] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        streams.append(send.__self__)
        assert _hypercorn.learn(send.__self__) is True
        changed = type("HTTPStream", (), {"__module__": type(send.__self__).__module__})()
        vars(changed).update(vars(send.__self__))
        del changed.app_put
        assert _hypercorn.learn(changed) is False
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    served = await hypercorn(app)
    client = await served.connect()
    await client.request()
    assert (await client.head()).status_code == 200
    assert len(streams) == 1
