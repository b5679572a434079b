"""In-process cost of the in-flight middleware, side by side with the bare app.

Run ``python -m bench.middleware [--quick]``. A trivial ASGI app is called in a tight loop with
a fixed scope, handed the ``receive`` and ``send`` of a real uvicorn (httptools) request cycle
over a transport that discards what is written, as uvicorn serves it: bare, wrapped in
:class:`InFlightMiddleware`, and wrapped in the smallest pure-ASGI counting middleware (the
floor any in-flight counter pays). For comparison, the middleware under a server it has no
unwrapped path for (no-op ``receive``/``send`` functions: every request wrapped), and a
Starlette ``BaseHTTPMiddleware`` that counts (what many users write first). The same is done for
a FastAPI app with and without ``runtime.install``. Variants run interleaved, round after round,
so machine noise hits all of them alike, and each is timed in this thread's own CPU time (on a
shared machine, wall time also counts the moments another process had the core). Targets: at most 1 µs added per request on the trivial
app, at most 1 % on the FastAPI app.
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

from fastapi import FastAPI
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


async def per_request_ns(app: App, calls: int, *, uvicorn: bool) -> float:
    """ns per call; ``uvicorn``: with a real request cycle's receive and send (one cycle, its
    response state reset before each call, as uvicorn starts each request on a fresh one)."""
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


async def measure(quick: bool) -> dict[str, list[float]]:
    rounds, calls = (3, 5_000) if quick else (9, 30_000)
    # name: (app, served through a uvicorn request cycle)
    variants: dict[str, tuple[App, bool]] = {
        "bare": (trivial, True),
        "inflight": (InFlightMiddleware(trivial, gate=IntakeGate()), True),
        "counting": (_Counting(trivial), True),
        "bare_plain": (trivial, False),
        "inflight_plain": (InFlightMiddleware(trivial, gate=IntakeGate()), False),
        "base_http": (counting_base_http(trivial), False),
        "fastapi": (fastapi_app(with_runtime=False), True),
        "fastapi_runtime": (fastapi_app(with_runtime=True), True),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for app, uvicorn in variants.values():  # warm up (FastAPI builds its stack on the first call)
        await per_request_ns(app, 200, uvicorn=uvicorn)
    for _ in range(rounds):
        for name, (app, uvicorn) in variants.items():
            samples[name].append(await per_request_ns(app, calls, uvicorn=uvicorn))
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
        _row("InFlightMiddleware added", samples["inflight"], bare, "≤ 1000 ns added"),
        _row("counting middleware added", samples["counting"], bare, "(comparison)"),
        _row("InFlightMiddleware, wrapped", samples["inflight_plain"], plain, "(comparison)"),
        _row("BaseHTTPMiddleware added", samples["base_http"], plain, "(comparison)"),
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
