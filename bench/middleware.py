"""In-process cost of the in-flight middleware, side by side with the bare app.

Run ``python -m bench.middleware [--quick]``. A trivial ASGI app is called in a tight loop with
a fixed scope and no-op ``receive``/``send``: bare, wrapped in :class:`InFlightMiddleware`, and
wrapped in a Starlette ``BaseHTTPMiddleware`` that counts the same way (what many users write
first). The same is done for a FastAPI app with and without ``runtime.install``. Variants run
interleaved, round after round, so machine noise hits all of them alike. Targets: at most 1 µs
added per request on the trivial app, at most 1 % on the FastAPI app.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import Response

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


async def per_request_ns(app: App, calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        await app(dict(SCOPE), _receive, _send)
    return (time.perf_counter_ns() - start) / calls


async def measure(quick: bool) -> dict[str, list[float]]:
    rounds, calls = (3, 5_000) if quick else (9, 30_000)
    variants: dict[str, App] = {
        "bare": trivial,
        "inflight": InFlightMiddleware(trivial, gate=IntakeGate()),
        "base_http": counting_base_http(trivial),
        "fastapi": fastapi_app(with_runtime=False),
        "fastapi_runtime": fastapi_app(with_runtime=True),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for app in variants.values():  # warm up (FastAPI builds its stack on the first call)
        await per_request_ns(app, 200)
    for _ in range(rounds):
        for name, app in variants.items():
            samples[name].append(await per_request_ns(app, calls))
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
    bare, fast = samples["bare"], samples["fastapi"]
    return [
        _row("InFlightMiddleware added", samples["inflight"], bare, "≤ 1000 ns added"),
        _row("BaseHTTPMiddleware added", samples["base_http"], bare, "(comparison)"),
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
