"""In-process cost of the in-flight middleware, side by side with the bare app.

Run ``python -m bench.middleware [--quick]``. A trivial ASGI app is called in a tight loop with
a fixed scope, handed the ``receive`` and ``send`` of a real uvicorn (httptools) request cycle
over a transport that discards what is written, as uvicorn serves it: bare, wrapped in
:class:`InFlightMiddleware`, and wrapped in the smallest pure-ASGI counting middleware (the
floor any in-flight counter pays). For comparison, the middleware under a server it has no
unwrapped path for (no-op ``receive``/``send`` functions: every request wrapped), and a
Starlette ``BaseHTTPMiddleware`` that counts (what many users write first). The trivial app is
also served through a hypercorn HTTP/1.1 stream's ``receive`` and ``send``: bare, wrapped in the
middleware (unwrapped path), and with every request wrapped, as before hypercorn had that path.
The same is done for a FastAPI app with and without ``runtime.install``, the two alternating in
blocks of 500 calls. Variants run interleaved, round after round, so machine noise hits all of
them alike, and each is timed in this thread's own CPU time (on a shared machine, wall time also
counts the moments another process had the core). Targets: at most 300 ns added per request on the
trivial app under uvicorn (a bare counting middleware's cost), 1 µs under hypercorn, at most 1 % on the
FastAPI app.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import h11
from fastapi import FastAPI
from hypercorn.config import Config as HypercornConfig
from hypercorn.protocol.http_stream import ASGIHTTPState, HTTPStream
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import Response
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from bench.apps.hello import _Counting
from forgezero_lifecycle.asgi.middleware import InFlightMiddleware
from forgezero_lifecycle.core.gate import IntakeGate
from forgezero_lifecycle.runtime import Runtime

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
COMMAND = "python -m bench.middleware"
SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "method": "GET",
    "scheme": "http",
    "path": "/",
    "raw_path": b"/",
    "root_path": "",
    "query_string": b"",
    "headers": [(b"host", b"bench")],
    "client": ("127.0.0.1", 50000),
    "server": ("127.0.0.1", 8000),
}
_REQUEST = {"type": "http.request", "body": b"", "more_body": False}
_START = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
_BODY = {"type": "http.response.body", "body": b"ok"}


async def _receive() -> dict[str, Any]:
    return _REQUEST


async def _send(message: Any) -> None:
    return None


class _NullTransport(asyncio.Transport):
    """What a request cycle writes to: discarded."""

    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def _cycle() -> RequestResponseCycle:
    """A uvicorn request cycle, ready for one request (its body already read by the server)."""
    transport = _NullTransport()
    cycle = RequestResponseCycle(
        scope=SCOPE,  # type: ignore[arg-type]
        transport=transport,
        flow=FlowControl(transport),
        logger=logging.getLogger("bench"),
        access_logger=logging.getLogger("bench"),
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )
    cycle.more_body = False
    return cycle


class _HypercornServer:
    """Stands for hypercorn's asyncio TCPServer: a writer over a discarding transport."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        self.writer = asyncio.StreamWriter(_NullTransport(), protocol, reader, loop)

    async def protocol_send(self, event: Any) -> None:
        return None


class _HypercornProtocol:
    """Stands for hypercorn's H11Protocol: takes the stream's events and drops them."""

    def __init__(self) -> None:
        self.connection = h11.Connection(h11.SERVER)
        self.send = _HypercornServer().protocol_send

    async def stream_send(self, event: Any) -> None:
        return None


def _stream() -> HTTPStream:
    """A hypercorn HTTP/1.1 stream, as its asyncio worker hands it to the app (receive: its app
    queue's get; send: its app_send), its request body already queued."""
    config = HypercornConfig()
    stream = HTTPStream(
        None,  # type: ignore[arg-type]
        config,
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        False,
        ("127.0.0.1", 50000),
        ("127.0.0.1", 8000),
        _HypercornProtocol().stream_send,
        1,
    )
    queue: asyncio.Queue[Any] = asyncio.Queue(config.max_app_queue_size)
    queue.put_nowait(_REQUEST)
    stream.app_put = queue.put
    stream.scope = SCOPE  # type: ignore[assignment]
    stream.start_time = 0.0
    return stream


async def trivial(scope: Any, receive: Any, send: Any) -> None:
    await send(_START)
    await send(_BODY)


def counting_base_http(app: App) -> App:
    """The BaseHTTPMiddleware way to count in-flight requests (for comparison only)."""
    in_flight = 0

    async def dispatch(request: Request, call_next: Any) -> Response:
        nonlocal in_flight
        in_flight += 1
        try:
            response: Response = await call_next(request)
            return response
        finally:
            in_flight -= 1

    return BaseHTTPMiddleware(app, dispatch=dispatch)


def fastapi_app(with_runtime: bool) -> App:
    app = FastAPI(openapi_url=None)

    @app.get("/")
    async def hello() -> dict[str, str]:
        return {"hello": "world"}

    if with_runtime:
        Runtime(control_token="bench-control-token-0123456789").install(app)
    return app


async def per_request_ns(app: App, calls: int, *, uvicorn: bool | str) -> float:
    """ns per call; ``uvicorn``: with a real request cycle's receive and send (one cycle, its
    response state reset before each call, as uvicorn starts each request on a fresh one);
    ``"hypercorn"``: the same with a hypercorn HTTP/1.1 stream's."""
    if uvicorn == "hypercorn":
        stream = _stream()
        receive, send = stream.app_put.__self__.get, stream.app_send  # type: ignore[attr-defined]
        start = time.thread_time_ns()
        for _ in range(calls):
            stream.state = ASGIHTTPState.REQUEST
            await app(dict(SCOPE), receive, send)
        return (time.thread_time_ns() - start) / calls
    if not uvicorn:
        start = time.thread_time_ns()
        for _ in range(calls):
            await app(dict(SCOPE), _receive, _send)
        return (time.thread_time_ns() - start) / calls
    cycle = _cycle()
    receive, send = cycle.receive, cycle.send
    start = time.thread_time_ns()
    for _ in range(calls):
        cycle.response_started = cycle.response_complete = False
        cycle.chunked_encoding = None
        await app(dict(SCOPE), receive, send)
    return (time.thread_time_ns() - start) / calls


#: Calls per block of the FastAPI pair, which alternates block by block.
FASTAPI_BLOCK = 500


async def measure(quick: bool) -> dict[str, list[float]]:
    rounds, calls = (3, 5_000) if quick else (9, 30_000)
    # As the middleware served hypercorn before it had an unwrapped path for it: every request
    # wrapped (the stream's class taken for one it does not know).
    wrapped = InFlightMiddleware(trivial, gate=IntakeGate())
    wrapped._other_kind = HTTPStream
    # name: (app, served through a uvicorn request cycle, or a hypercorn stream)
    variants: dict[str, tuple[App, bool | str]] = {
        "bare": (trivial, True),
        "inflight": (InFlightMiddleware(trivial, gate=IntakeGate()), True),
        "counting": (_Counting(trivial), True),
        "bare_plain": (trivial, False),
        "inflight_plain": (InFlightMiddleware(trivial, gate=IntakeGate()), False),
        "base_http": (counting_base_http(trivial), False),
        "bare_hypercorn": (trivial, "hypercorn"),
        "inflight_hypercorn": (InFlightMiddleware(trivial, gate=IntakeGate()), "hypercorn"),
        "inflight_hypercorn_wrapped": (wrapped, "hypercorn"),
    }
    # The FastAPI pair, alternating in short blocks (bare, ours, ours, bare, ...) within each
    # round: a FastAPI call allocates enough that collector passes and the neighbours' load land
    # on one variant's whole block otherwise (±30 % from round to round).
    pair = {
        "fastapi": fastapi_app(with_runtime=False),
        "fastapi_runtime": fastapi_app(with_runtime=True),
    }
    samples: dict[str, list[float]] = {name: [] for name in [*variants, *pair]}
    for app, uvicorn in [*variants.values(), *((app, True) for app in pair.values())]:
        await per_request_ns(app, 200, uvicorn=uvicorn)  # warm up (FastAPI builds its stack)
    blocks = calls // FASTAPI_BLOCK
    for _ in range(rounds):
        for name, (app, uvicorn) in variants.items():
            samples[name].append(await per_request_ns(app, calls, uvicorn=uvicorn))
        spent = dict.fromkeys(pair, 0.0)
        for block in range(blocks):
            for name in pair if block % 2 == 0 else reversed(pair):
                spent[name] += await per_request_ns(pair[name], FASTAPI_BLOCK, uvicorn=True)
        for name, total in spent.items():
            samples[name].append(total / blocks)
    return samples


def _row(metric: str, side: list[float], base: list[float], target: str) -> dict[str, object]:
    # Paired per-round figures: the ns each round adds to its own baseline round.
    paired = [s - b for s, b in zip(side, base, strict=True)]
    return {
        "benchmark": "middleware",
        "metric": metric,
        "unit": "ns/request added",
        "min": min(paired),
        "median": statistics.median(paired),
        "max": max(paired),
        "baseline_median": statistics.median(base),
        "ratio": statistics.median(s / b for s, b in zip(side, base, strict=True)),
        "target": target,
        "command": COMMAND,
    }


def run(quick: bool) -> list[dict[str, object]]:
    samples = asyncio.run(measure(quick))
    bare, fast, plain = samples["bare"], samples["fastapi"], samples["bare_plain"]
    return [
        _row("InFlightMiddleware added", samples["inflight"], bare, "≤ 300 ns added"),
        _row("counting middleware added", samples["counting"], bare, "(comparison)"),
        _row("InFlightMiddleware, wrapped", samples["inflight_plain"], plain, "(comparison)"),
        _row("BaseHTTPMiddleware added", samples["base_http"], plain, "(comparison)"),
        _row(
            "InFlightMiddleware, hypercorn",
            samples["inflight_hypercorn"],
            samples["bare_hypercorn"],
            "≤ 1000 ns added",
        ),
        _row(
            "  wrapped, hypercorn",
            samples["inflight_hypercorn_wrapped"],
            samples["bare_hypercorn"],
            "(comparison)",
        ),
        _row(
            "FastAPI + runtime added",
            samples["fastapi_runtime"],
            fast,
            "≤ 1 % (ratio ≤ 1.01)",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, for a smoke check")
    args = parser.parse_args(argv)
    rows = run(args.quick)
    print(
        f"{'metric':<28} {'median':>10} {'min':>10} {'max':>10} {'baseline':>10} {'ratio':>7}  target"
    )
    for row in rows:
        print(
            f"{row['metric']:<28} {row['median']:>10.0f} {row['min']:>10.0f} {row['max']:>10.0f}"
            f" {row['baseline_median']:>10.0f} {row['ratio']:>7.3f}  {row['target']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
