"""The demo's traffic: concurrent HTTP clients and WebSocket sessions behind a switchable router.

The router sends new work to the primary generation. A request the primary refuses (503
``RUNTIME_DRAINING``: never processed, so safe to repeat, even a POST) is sent again to the
standby. A WebSocket closed with 1012 (service restart) reconnects the same way. Anything else
that goes wrong (a cut connection, a truncated stream, a 5xx) counts as lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Final, Literal, final

import httpx
import orjson

__all__ = [
    "HttpTally",
    "Router",
    "Target",
    "WebSocketTally",
    "one_port_clients",
    "run_http_client",
    "run_websocket",
]

REFUSAL: Final = {"error": "RUNTIME_DRAINING"}
MAX_ATTEMPTS: Final = 4
STREAM_CHUNKS: Final = 5
#: Seconds a pooled connection may stay idle: below the server's keep-alive timeout.
KEEPALIVE_EXPIRY: Final = 2.0

Outcome = Literal["ok", "refused"]


@final
@dataclass
class Target:
    """One generation as the router sees it."""

    label: str
    url: str
    http: httpx.AsyncClient
    outstanding: int = 0

    @property
    def ws_url(self) -> str:
        return "ws" + self.url.removeprefix("http") + "/ws"


@final
class Router:
    """Primary and standby; :meth:`switch` makes the standby primary."""

    def __init__(self, primary: Target) -> None:
        self.primary = primary
        self.standby: Target | None = None

    def other(self, target: Target) -> Target:
        if target is self.primary and self.standby is not None:
            return self.standby
        return self.primary

    def switch(self) -> None:
        if self.standby is not None:
            self.primary, self.standby = self.standby, None


@dataclass
class HttpTally:
    sent: int = 0
    completed: Counter[str] = field(default_factory=Counter)
    refused_then_completed: int = 0
    lost: int = 0
    problems: list[str] = field(default_factory=list)


@dataclass
class WebSocketTally:
    opened: Counter[str] = field(default_factory=Counter)
    closed_1012: int = 0
    reconnected: int = 0
    dropped: int = 0
    echoes: int = 0
    problems: list[str] = field(default_factory=list)


class _LostError(Exception):
    """A request that failed in a way a refusal cannot explain."""


async def _attempt(target: Target, kind: str, rng: random.Random) -> Outcome:
    target.outstanding += 1
    try:
        if kind == "stream":
            params = {"chunks": str(STREAM_CHUNKS), "ms": "60"}
            async with target.http.stream("GET", "/stream", params=params) as response:
                body = await response.aread()
        else:
            params = {"ms": str(rng.randint(100, 900))} if kind == "slow" else {}
            response = await target.http.get(f"/{kind}", params=params)
            body = response.content
    except httpx.ConnectError:
        return "refused"  # nothing was sent: as safe to repeat as a refusal
    except httpx.HTTPError as error:
        raise _LostError(f"{kind} on {target.label}: {type(error).__name__}") from None
    finally:
        target.outstanding -= 1
    if response.status_code == 503 and orjson.loads(body or b"null") == REFUSAL:
        return "refused"
    if response.status_code != 200:
        raise _LostError(f"{kind} on {target.label}: HTTP {response.status_code}")
    if kind == "stream" and not (body.endswith(b"end\n") and body.count(b"\n") == 6):
        raise _LostError(f"stream on {target.label}: truncated after {body.count(b'chunk')} chunks")
    return "ok"


async def _one(router: Router, tally: HttpTally, rng: random.Random) -> None:
    kind = rng.choices(("fast", "slow", "stream"), weights=(60, 25, 15))[0]
    tally.sent += 1
    target = router.primary
    refused = False
    for _ in range(MAX_ATTEMPTS):
        try:
            outcome = await _attempt(target, kind, rng)
        except _LostError as lost:
            tally.lost += 1
            tally.problems.append(str(lost))
            return
        if outcome == "ok":
            tally.completed[target.label] += 1
            tally.refused_then_completed += refused
            return
        refused = True
        target = router.other(target)
        await asyncio.sleep(0.02)
    tally.lost += 1
    tally.problems.append(f"{kind}: refused {MAX_ATTEMPTS} times")


async def run_http_client(router: Router, tally: HttpTally, stop: asyncio.Event, seed: int) -> None:
    """One client: requests back to back (with a short think time) until ``stop``."""
    rng = random.Random(seed)
    while not stop.is_set():
        await _one(router, tally, rng)
        await asyncio.sleep(rng.uniform(0.005, 0.03))


@contextlib.asynccontextmanager
async def one_port_clients(url: str, clients: int, *, seed: int) -> AsyncIterator[HttpTally]:
    """``clients`` keep-alive HTTP clients sending to ``url`` alone (no router to move to) while
    the block runs; stopped and closed when it ends. Yields their tally."""
    # Idle connections expire here before the server's keep-alive timeout (uvicorn's 5 s) does:
    # at equal timeouts the server's close of an idle connection races the next request sent on
    # it (docs/servers.md, "A proxy or a client pool in front").
    limits = httpx.Limits(
        max_connections=clients + 4,
        max_keepalive_connections=clients + 4,
        keepalive_expiry=KEEPALIVE_EXPIRY,
    )
    http = httpx.AsyncClient(base_url=url, timeout=30.0, limits=limits, trust_env=False)
    router = Router(Target("port", url, http))
    tally = HttpTally()
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(run_http_client(router, tally, stop, seed=seed + n))
        for n in range(clients)
    ]
    try:
        yield tally
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await http.aclose()


async def run_websocket(router: Router, tally: WebSocketTally, stop: asyncio.Event) -> None:
    """One session: echo a message every 100 ms; on close 1012, reconnect to the standby."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    target = router.primary
    reconnecting = False
    for _ in range(MAX_ATTEMPTS):
        try:
            async with connect(target.ws_url, proxy=None, open_timeout=5) as session:
                await session.recv()  # the hello
                tally.opened[target.label] += 1
                tally.reconnected += reconnecting
                while not stop.is_set():
                    await session.send("ping")
                    if await session.recv() == "ping":
                        tally.echoes += 1
                    await asyncio.sleep(0.1)
                return
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd is not None else None
            if code != 1012:
                tally.dropped += 1
                tally.problems.append(f"WebSocket on {target.label} closed with {code}")
                return
            tally.closed_1012 += 1
        except InvalidStatus as refused:
            if refused.response.status_code != 503:
                tally.dropped += 1
                tally.problems.append(f"WebSocket refused with {refused.response.status_code}")
                return
        except OSError as error:
            tally.dropped += 1
            tally.problems.append(f"WebSocket to {target.label}: {type(error).__name__}")
            return
        reconnecting = True
        target = router.other(target)
        await asyncio.sleep(0.05)
    tally.dropped += 1
    tally.problems.append("WebSocket: no generation accepted the reconnect")
