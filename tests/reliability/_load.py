"""A bounded load generator: concurrent keep-alive HTTP clients behind a switchable router.

Each client runs requests one after another (fast, slow, streaming and POST with a checked body)
until told to stop; every request carries a unique ``x-request-id`` that the servers record. A
request refused with ``503 {"error":"RUNTIME_DRAINING"}`` was never processed, so the client sends
it again, even a POST, to the other generation; so is one whose connection was refused (the
process is gone). Anything else that goes wrong is kept as the attempt's outcome, for the test
to judge against the servers' records.
"""

from __future__ import annotations

import hashlib
import os
import random
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, final

import anyio
import anyio.abc
import httpx

from forgezero_lifecycle.core._httpx import tls_context
from forgezero_lifecycle.stop.server import CLOSE_REFUSAL_HEADER, FIRST_BYTE_GRACE

__all__ = [
    "REFUSAL",
    "Attempt",
    "HttpLoad",
    "LateSenders",
    "RequestRecord",
    "Router",
    "Target",
    "refused_before",
]

REFUSAL: Final = b'{"error":"RUNTIME_DRAINING"}'
CLOSE_HEADER: Final = CLOSE_REFUSAL_HEADER[0].decode()
CLOSE_VALUE: Final = CLOSE_REFUSAL_HEADER[1].decode()
_CLOSE_LINE: Final = b": ".join(CLOSE_REFUSAL_HEADER)
KINDS: Final = ("fast", "slow", "stream", "post")
WEIGHTS: Final = (0.45, 0.2, 0.15, 0.2)
#: Attempts per request; a retry on the same target waits RETRY_PAUSE first (bounded: ~10 s).
MAX_ATTEMPTS: Final = 200
RETRY_PAUSE: Final = 0.05
STREAM_CHUNKS: Final = 5
#: Seconds a pooled connection may stay idle: below uvicorn's keep-alive timeout (5 s), as for any
#: proxy in front of a server (docs/servers.md, "A proxy or a client pool in front"). At equal
#: timeouts the server's close of an idle connection races the next request sent on it, which
#: then fails without an answer (httpx's default is 5 s, uvicorn's is 5 s).
KEEPALIVE_EXPIRY: Final = 2.0


@final
@dataclass(eq=False)
class Target:
    """One generation as the router sees it: a label, a URL and a keep-alive connection pool."""

    label: str
    url: str
    http: httpx.AsyncClient
    outstanding: int = 0

    @classmethod
    def open(cls, label: str, url: str, connections: int, *, http2: bool = False) -> Target:
        """``http2``: HTTP/2 with prior knowledge (h2c), the clients' requests multiplexed."""
        limits = httpx.Limits(
            max_connections=connections,
            max_keepalive_connections=connections,
            keepalive_expiry=KEEPALIVE_EXPIRY,
        )
        client = httpx.AsyncClient(
            base_url=url,
            limits=limits,
            timeout=30.0,
            trust_env=False,
            http1=not http2,
            http2=http2,
            verify=tls_context(),
        )
        return cls(label, url, client)

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http") + "/ws"

    async def wait_quiet(self, seconds: float = 15.0) -> None:
        """Wait until no request of the load is outstanding on this target (bounded)."""
        with anyio.fail_after(seconds):
            while self.outstanding:  # noqa: ASYNC110 - a counter the load's tasks update
                await anyio.sleep(0.01)


@final
class Router:
    """Primary and standby; new work goes to the primary, a refused retry to the other one."""

    def __init__(self, primary: Target) -> None:
        self.primary = primary
        self.standby: Target | None = None

    def other(self, target: Target) -> Target:
        if target is self.primary and self.standby is not None:
            return self.standby
        return self.primary

    def switch(self) -> Target:
        """Make the standby primary; returns the old primary."""
        assert self.standby is not None
        old, self.primary, self.standby = self.primary, self.standby, None
        return old


@dataclass(frozen=True)
class Attempt:
    target: str
    #: ok | refused | connect-refused | error:<exception> | bad:<what was wrong>
    outcome: str


@dataclass
class RequestRecord:
    id: str
    kind: str
    attempts: list[Attempt] = field(default_factory=list)
    done_at: float = 0.0
    #: A late sender's: seconds its connection really stayed silent after the connect (its
    #: ``lateness``, and whatever its loop lagged on a loaded machine).
    silent: float = 0.0
    #: Refused by the 503 a stop writes as it closes a connection (``x-forgezero-refusal:
    #: connection-closed``): the request crossed that close, the keep-alive race every server
    #: closing an idle connection has, and was never read. Not a refusal of admission.
    at_close: bool = False

    @property
    def outcome(self) -> str:
        return self.attempts[-1].outcome if self.attempts else "never-sent"

    @property
    def served_by(self) -> str | None:
        last = self.attempts[-1] if self.attempts else None
        return last.target if last is not None and last.outcome == "ok" else None

    @property
    def refusals(self) -> int:
        return sum(a.outcome == "refused" for a in self.attempts)


@final
class HttpLoad:
    """``clients`` concurrent clients sending mixed requests through ``router`` until stopped."""

    def __init__(
        self,
        router: Router,
        *,
        clients: int,
        seed: int,
        think: float = 0.01,
        retry: bool = True,
        kinds: tuple[str, ...] = KINDS,
    ) -> None:
        self.router = router
        self.clients = clients
        self.seed = seed
        self.think = think
        #: False: one attempt per request, as a client with nowhere else to go sees it.
        self.retry = retry
        self.kinds = kinds
        self.records: list[RequestRecord] = []
        self._stop = anyio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        async with anyio.create_task_group() as group:
            for number in range(self.clients):
                group.start_soon(self._client, number)

    async def _client(self, number: int) -> None:
        rng = random.Random(self.seed * 1000 + number)
        sequence = 0
        while not self._stop.is_set():
            sequence += 1
            kind = rng.choices(KINDS, WEIGHTS)[0] if self.kinds == KINDS else rng.choice(self.kinds)
            record = RequestRecord(f"s{self.seed}c{number}n{sequence}", kind)
            self.records.append(record)
            await self._send(record, rng)
            await anyio.sleep(rng.random() * self.think)

    async def _send(self, record: RequestRecord, rng: random.Random) -> None:
        request = _Request.make(record, rng)
        target = self.router.primary
        for _ in range(MAX_ATTEMPTS):
            outcome = await _attempt(target, request)
            record.attempts.append(Attempt(target.label, outcome))
            if not self.retry or outcome not in ("refused", "connect-refused"):
                break
            following = self.router.other(target)
            if following is target:
                await anyio.sleep(RETRY_PAUSE)
            target = following
        record.done_at = time.monotonic()


@dataclass(frozen=True)
class _Request:
    record: RequestRecord
    params: dict[str, str]
    body: bytes = b""

    @classmethod
    def make(cls, record: RequestRecord, rng: random.Random) -> _Request:
        if record.kind == "slow":
            return cls(record, {"ms": str(rng.randint(100, 600))})
        if record.kind == "stream":
            return cls(record, {"chunks": str(STREAM_CHUNKS), "ms": str(rng.randint(10, 50))})
        if record.kind == "post":
            return cls(record, {}, rng.randbytes(rng.randint(1, 64 * 1024)))
        return cls(record, {})


async def _attempt(target: Target, request: _Request) -> str:
    record = request.record
    headers = {"x-request-id": record.id}
    target.outstanding += 1
    try:
        if record.kind == "post":
            headers["x-body-sha256"] = hashlib.sha256(request.body).hexdigest()
            response = await target.http.post("/submit", content=request.body, headers=headers)
        else:
            path = "/" + record.kind
            response = await target.http.get(path, params=request.params, headers=headers)
    except httpx.ConnectError:
        return "connect-refused"
    except httpx.TransportError as error:
        return f"error:{type(error).__name__}:{error}"
    finally:
        target.outstanding -= 1
    if response.status_code == 503 and response.content == REFUSAL:
        record.at_close = response.headers.get(CLOSE_HEADER) == CLOSE_VALUE
        return "refused"
    return _judge(target.label, request, response)


def _judge(label: str, request: _Request, response: httpx.Response) -> str:
    record = request.record
    if response.status_code != 200:
        return f"bad:status {response.status_code} {response.content[:80]!r}"
    if record.kind == "stream":
        expected = "".join(f"{label} chunk {i}\n" for i in range(STREAM_CHUNKS)) + "end\n"
        return "ok" if response.text == expected else f"bad:stream {response.text[-40:]!r}"
    body = response.json()
    if body.get("id") != record.id or body.get("gen") != label:
        return f"bad:body {body!r}"
    if record.kind == "post" and body.get("sha256") != hashlib.sha256(request.body).hexdigest():
        return "bad:digest"
    return "ok"


@final
class LateSenders:
    """Raw-socket clients that connect, wait up to ``lateness`` seconds, then send one request.

    They stand for clients whose connection the server has accepted but whose request it has
    not read yet: the connections a stop must not close under them. Each request is judged
    like the load's: ``ok``, ``refused`` (503 from the runtime), ``connect-refused`` (also a
    connection the server closed before the request was sent: nothing went out), or
    ``error:…`` (the connection ended without an answer).
    """

    def __init__(self, url: str, label: str, *, clients: int, seed: int, lateness: float) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.host, self.port, self.label = host, int(port), label
        self.clients, self.seed, self.lateness = clients, seed, lateness
        self.records: list[RequestRecord] = []
        self._stop = anyio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        async with anyio.create_task_group() as group:
            for number in range(self.clients):
                group.start_soon(self._client, number)

    async def _client(self, number: int) -> None:
        rng = random.Random(self.seed * 1000 + number)
        sequence = 0
        while not self._stop.is_set():
            sequence += 1
            record = RequestRecord(f"late{self.seed}c{number}n{sequence}", "fast")
            self.records.append(record)
            outcome = await self._attempt(record, rng.random() * self.lateness)
            record.attempts.append(Attempt(self.label, outcome))
            record.done_at = time.monotonic()
            if outcome == "connect-refused":
                await anyio.sleep(RETRY_PAUSE)

    async def _attempt(self, record: RequestRecord, lateness: float) -> str:
        request_id = record.id
        try:
            stream = await anyio.connect_tcp(self.host, self.port)
        except OSError:
            return "connect-refused"
        connected = time.monotonic()
        request = (
            f"GET /fast HTTP/1.1\r\nhost: {self.host}\r\nx-request-id: {request_id}\r\n"
            "connection: close\r\n\r\n"
        ).encode()
        answer = bytearray()
        try:
            async with stream:
                await anyio.sleep(lateness)
                record.silent = time.monotonic() - connected
                if _closed_under(stream):
                    # What a client sees before it sends, as on a refused connection: nothing
                    # went out, so it may send again (httpx looks the same way before it reuses
                    # a pooled connection). A client of a loaded machine may wait past the
                    # stop's first-byte grace, which closes such a connection.
                    return "connect-refused"
                await stream.send(request)
                with anyio.fail_after(30):
                    while True:
                        try:
                            answer += await stream.receive()
                        except anyio.EndOfStream:
                            break
        except (OSError, anyio.BrokenResourceError) as error:
            return f"error:{type(error).__name__}:{error} after {len(answer)} bytes"
        outcome = _judge_raw(self.label, request_id, bytes(answer))
        head = bytes(answer).partition(b"\r\n\r\n")[0].lower()
        record.at_close = outcome == "refused" and _CLOSE_LINE in head
        return outcome


def refused_before(records: Iterable[RequestRecord], moment: float) -> list[RequestRecord]:
    """The requests refused (503 or a refused connection) before ``moment`` that the stop's
    promise covers: all but those of a late sender whose connection stayed silent longer than
    the first-byte grace (its own loop lagged: the server closes such a connection by design,
    docs/serve.md "Stopping"), and those that crossed a connection's close (:attr:`at_close`:
    refused at the socket, never read, not refused at admission)."""
    return [
        r
        for r in records
        if r.outcome in ("refused", "connect-refused")
        and r.done_at < moment
        and r.silent <= FIRST_BYTE_GRACE
        and not r.at_close
    ]


def _closed_under(stream: anyio.abc.SocketStream) -> bool:
    """Whether the server closed (or reset) the connection before anything was sent on it."""
    raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)  # asyncio's: no recv of its own
    with socket.socket(fileno=os.dup(raw.fileno())) as probe:
        try:
            return probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True


def _judge_raw(label: str, request_id: str, answer: bytes) -> str:
    if not answer:
        return "error:closed without an answer"
    head, _, body = answer.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1] if head.count(b" ") >= 1 else b""
    if status == b"503" and body == REFUSAL:
        return "refused"
    if status != b"200":
        return f"bad:status {head[:60]!r}"
    if f'"id":"{request_id}"'.encode() not in body or f'"gen":"{label}"'.encode() not in body:
        return f"bad:body {body[:80]!r}"
    return "ok"
