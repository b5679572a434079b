"""HTTP/2 clients told to go by GOAWAY, twice, under real hypercorn (h2c and TLS with ALPN).

A drain's first instant sends GOAWAY with the largest stream id on every HTTP/2 connection the
middleware has seen; once intake closes (after the not-ready grace) the final GOAWAY names the
last stream hypercorn took in, and the connection is closed. A connection with streams still
running is told once they are done: Python's h2 fails every open stream of a connection that
received a GOAWAY, whatever its last stream id. The client here is the h2 library over a
socket; the drains run on a manual clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import httpx
import pytest

from forgezero_lifecycle.core._httpx import tls_context
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.testing import ManualClock
from tests.asgi._hypercorn_server import BOUND, Message, until
from tests.certificates import self_signed

pytestmark = pytest.mark.anyio

TOKEN = "h2-goaway-token-0123456789abcdef"
NOT_READY_GRACE = 5.0


def drain_request() -> dict[str, Any]:
    return {
        "protocol": "forgezero-drain/v1",
        "nonce": "G" * 43,
        "sourceRevision": "a" * 40,
        "targetRevision": "b" * 40,
        "timeoutMs": 30_000,
    }


class H2Client:
    """A cleartext HTTP/2 client (prior knowledge) that reads every frame as it comes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.h2 = h2.connection.H2Connection(config)
        self.events: list[h2.events.Event] = []
        self.closed = asyncio.Event()
        self.changed = asyncio.Event()
        self._reading: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, port: int, tls: ssl.SSLContext | None = None) -> H2Client:
        client = cls(*await asyncio.open_connection("127.0.0.1", port, ssl=tls))
        if tls is not None:
            assert client.writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        client.h2.initiate_connection()
        client._flush()
        client._reading = asyncio.ensure_future(client._read())
        return client

    def get(self, path: str = "/") -> int:
        stream_id: int = self.h2.get_next_available_stream_id()
        headers = [(":method", "GET"), (":path", path), (":scheme", "http"), (":authority", "t")]
        self.h2.send_headers(stream_id, headers, end_stream=True)
        self._flush()
        return stream_id

    def received(self, kind: type[h2.events.Event]) -> list[Any]:
        return [event for event in self.events if isinstance(event, kind)]

    def response(self, stream_id: int) -> tuple[int | None, bytes, bool]:
        """Status, body and whether the stream ended, as received so far."""
        status = None
        body = b""
        for event in self.events:
            if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream_id:
                status = int(dict(event.headers)[":status"])
            elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream_id:
                body += event.data
        ended = any(
            isinstance(event, h2.events.StreamEnded) and event.stream_id == stream_id
            for event in self.events
        )
        return status, body, ended

    async def wait(self, condition: Any) -> None:
        async with asyncio.timeout(BOUND):
            while not condition():
                self.changed.clear()
                await self.changed.wait()

    async def _read(self) -> None:
        try:
            while data := await self.reader.read(65536):
                events = self.h2.receive_data(data)
                for event in events:
                    if isinstance(event, h2.events.DataReceived):
                        self.h2.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                self.events.extend(events)
                self._flush()
                self.changed.set()
        finally:
            self.closed.set()
            self.changed.set()

    def _flush(self) -> None:
        if not self.writer.is_closing():
            self.writer.write(self.h2.data_to_send())

    async def aclose(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


@pytest.fixture(params=["h2c", "tls"])
def tls(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[ssl.SSLContext, Path] | None:
    """None for cleartext HTTP/2; for TLS, the client's context (ALPN h2, trusting a
    self-signed certificate made here with the openssl command) and the certificate's path."""
    if request.param == "h2c":
        return None
    certificate, _ = self_signed(tmp_path)
    context = ssl.create_default_context(cafile=str(certificate))
    context.set_alpn_protocols(["h2"])
    return context, certificate


def goaways(client: H2Client) -> list[tuple[int, int]]:
    """(last stream id, error code) of each GOAWAY the client received."""
    return [
        (event.last_stream_id, event.error_code)
        for event in client.received(h2.events.ConnectionTerminated)
    ]


async def test_goaway_at_start_and_grace(
    hypercorn: Any, tls: tuple[ssl.SSLContext, Path] | None
) -> None:
    """An idle connection gets GOAWAY (largest stream id) the instant the drain begins; a new
    connection during the not-ready grace is served; a connection busy at the drain's start
    gets its GOAWAY once its stream is done, the stream answered whole; after the grace each
    gets the final GOAWAY naming its last stream, and is closed. Nothing is lost."""
    clock = ManualClock()
    runtime = Runtime(
        control_token=TOKEN,
        clock=clock,
        not_ready_grace=NOT_READY_GRACE,
        drain_on_signal=False,
    )
    release = asyncio.Event()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        if scope["path"] == "/slow":
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    if tls is None:
        served = await hypercorn(runtime.wrap(app))
        context = None
    else:
        context, certificate = tls
        keyfile = str(certificate.with_suffix(".key"))
        served = await hypercorn(runtime.wrap(app), certfile=str(certificate), keyfile=keyfile)
    idle = await H2Client.connect(served.port, context)
    busy = await H2Client.connect(served.port, context)
    late: H2Client | None = None
    try:
        first = idle.get()
        await idle.wait(lambda: idle.response(first)[2])
        slow = busy.get("/slow")
        await until(lambda: runtime.gate.statistics().http == 1)

        runtime.drain.begin(drain_request())
        await idle.wait(lambda: goaways(idle))
        assert goaways(idle) == [(first, 0)]
        assert not idle.closed.is_set()
        assert goaways(busy) == []  # its stream is still running

        late = await H2Client.connect(served.port, context)  # during the not-ready grace: served
        during = late.get()
        await late.wait(lambda: late.response(during)[2])
        assert late.response(during) == (200, b"ok", True)

        release.set()
        await busy.wait(lambda: goaways(busy))
        assert busy.response(slow) == (200, b"ok", True)
        assert goaways(busy) == [(slow, 0)]

        await clock.advance(NOT_READY_GRACE)  # intake closes: the final GOAWAY
        for client, last in ((idle, first), (busy, slow)):
            await client.wait(lambda c=client: len(goaways(c)) == 2)
            assert goaways(client)[1] == (last, 0)
            await asyncio.wait_for(client.closed.wait(), BOUND)
        assert await asyncio.wait_for(runtime.drain.wait(), BOUND) == "drained"
        assert idle.response(first) == (200, b"ok", True)
        assert runtime.gate.statistics().refused_http == 0
    finally:
        for client in (idle, busy, late):
            if client is not None:
                await client.aclose()


async def test_httpx_moves_losing_nothing(
    hypercorn: Any,
) -> None:
    """httpx (httpcore over h2) does not read an idle pooled connection, so its next request
    after the GOAWAY goes out on the old connection: that stream came after the GOAWAY's last
    stream id, so it is refused unprocessed (the app never sees it) and httpx sends it again
    on a new connection. Every request during the not-ready grace gets 200, each processed
    once."""
    clock = ManualClock()
    runtime = Runtime(
        control_token=TOKEN, clock=clock, not_ready_grace=NOT_READY_GRACE, drain_on_signal=False
    )
    processed: list[str] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        processed.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    wrapped = runtime.wrap(app)
    served = await hypercorn(wrapped)
    async with httpx.AsyncClient(
        http1=False, http2=True, timeout=BOUND, verify=tls_context()
    ) as client:
        assert (await client.get(served.url + "/before")).status_code == 200
        runtime.drain.begin(drain_request())
        await until(lambda: len(wrapped._h2_last) == 1)  # the GOAWAY is written
        answers = [(await client.get(served.url + f"/during{index}")) for index in range(3)]
    assert [(answer.status_code, answer.http_version) for answer in answers] == [
        (200, "HTTP/2")
    ] * 3
    assert processed == ["/before", "/during0", "/during1", "/during2"]


@pytest.mark.parametrize("path", ["/.forgezero/runtime/live", "/exempt/probe"])
async def test_goaway_on_a_connection_that_carried_no_app_request(
    hypercorn: Any, path: str
) -> None:
    """A connection whose only requests were the control plane's (a prober over HTTP/2) or an
    exempt path's is known to the drain too: it gets the GOAWAY at the drain's first instant and
    the final one once intake closed, like a connection that carried an app request."""
    clock = ManualClock()
    runtime = Runtime(
        control_token=TOKEN,
        clock=clock,
        not_ready_grace=NOT_READY_GRACE,
        drain_on_signal=False,
        exempt=lambda scope: str(scope["path"]).startswith("/exempt/"),
    )

    async def app(scope: Message, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    served = await hypercorn(runtime.wrap(app))
    prober = await H2Client.connect(served.port)
    try:
        probe = prober.get(path)
        await prober.wait(lambda: prober.response(probe)[2])
        assert prober.response(probe)[0] == 200
        assert runtime.gate.statistics().http == 0  # nothing counted: no app request

        runtime.drain.begin(drain_request())
        await prober.wait(lambda: goaways(prober))
        assert goaways(prober) == [(probe, 0)]

        await clock.advance(NOT_READY_GRACE)  # intake closes: the final GOAWAY, then the close
        await prober.wait(lambda: len(goaways(prober)) == 2)
        assert goaways(prober)[1] == (probe, 0)
        await asyncio.wait_for(prober.closed.wait(), BOUND)
    finally:
        await prober.aclose()


async def test_goaway_waits_for_the_last_frames_of_a_slow_client(hypercorn: Any) -> None:
    """A stream leaves hypercorn's ``streams`` once its app is done, while its last DATA and
    END_STREAM may still wait for a client slow to read. The final GOAWAY (and the close) wait
    for those too: the client receives the response whole and ended, then the GOAWAY.

    The slow client is played by pausing the server's writing, as its transport does above its
    high-water mark: a real client cannot be stopped at that exact frame. Before the fix the
    GOAWAY went out between the last DATA and END_STREAM and the close dropped END_STREAM.
    """
    clock = ManualClock()
    runtime = Runtime(
        control_token=TOKEN, clock=clock, not_ready_grace=NOT_READY_GRACE, drain_on_signal=False
    )
    sends: list[Any] = []
    go_on = asyncio.Event()
    returned = asyncio.Event()

    async def app(scope: Message, receive: Any, send: Any) -> None:
        sends.append(send)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await go_on.wait()
        await send({"type": "http.response.body", "body": b"last part", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        returned.set()

    served = await hypercorn(runtime.wrap(app))
    client = await H2Client.connect(served.port)
    try:
        stream_id = client.get()
        await until(lambda: runtime.gate.statistics().http == 1)
        runtime.drain.begin(drain_request())
        stream = sends[0].__self__._send.__self__  # hypercorn's HTTPStream (the wrapped path)
        protocol = stream.send.__self__  # its H2Protocol
        writing = protocol.send.__self__.writer.transport.get_protocol()
        writing.pause_writing()  # the client stops reading: the writer's drain() blocks
        go_on.set()
        await asyncio.wait_for(returned.wait(), BOUND)
        await until(lambda: stream_id not in protocol.streams)  # the app is done with it
        assert stream_id in protocol.stream_buffers  # its END_STREAM is not written yet

        await clock.advance(NOT_READY_GRACE)  # intake closes: the final GOAWAY's moment
        assert await asyncio.wait_for(runtime.drain.wait(), BOUND) == "drained"
        writing.resume_writing()  # the client reads again
        await asyncio.wait_for(client.closed.wait(), BOUND)
        assert client.response(stream_id) == (200, b"last part", True)
        assert goaways(client)[-1] == (stream_id, 0)
        ended = next(
            index
            for index, event in enumerate(client.events)
            if isinstance(event, h2.events.StreamEnded)
        )
        first_goaway = next(
            index
            for index, event in enumerate(client.events)
            if isinstance(event, h2.events.ConnectionTerminated)
        )
        assert ended < first_goaway
    finally:
        await client.aclose()
