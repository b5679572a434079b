"""HTTP load from a separate process on 127.0.0.1: ``wrk`` when installed, else a Python client.

:func:`run_load` drives one URL for a bounded time (or a bounded number of requests) with a
fixed number of keep-alive connections, one request outstanding on each (as ``wrk`` does), and
returns requests/s and latency percentiles. With ``tool="auto"`` it uses ``wrk -t1`` when it is
on ``PATH``, else this module's own generator in a child process (``python -m bench._load``):
raw asyncio protocols (uvloop when installed) writing one prepared ``GET`` and counting
``Content-Length`` responses, so it costs far less CPU per request than any HTTP library. As
``wrk`` does, a connection the server closes (after a ``Connection: close`` response, or under
a request, which then counts as an error) is opened again until the run is over.
Everything is bounded: the duration, the request count, and a hard timeout on the child.

``FORGEZERO_BENCH_LOAD=python`` (or ``wrk``) overrides the choice of ``tool="auto"``, e.g. to
check the Python generator on a machine that has ``wrk``. Only loopback URLs are accepted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Final, Literal, cast
from urllib.parse import urlsplit

__all__ = ["LoadResult", "loader_name", "run_load"]

Tool = Literal["auto", "wrk", "python"]
_MAX_SECONDS: Final = 120.0
_MAX_CONNECTIONS: Final = 256
_WRK_RPS: Final = re.compile(r"Requests/sec:\s*([0-9.]+)")
_WRK_TOTAL: Final = re.compile(r"([0-9]+) requests in ([0-9.]+)(us|ms|s|m)")
_WRK_PCT: Final = re.compile(r"^\s*(50|99)%\s+([0-9.]+)(us|ms|s|m)\s*$", re.MULTILINE)
_WRK_NON2XX: Final = re.compile(r"Non-2xx or 3xx responses:\s*([0-9]+)")
_WRK_SOCKET: Final = re.compile(
    r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)"
)
_TO_MS: Final = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}
#: How long the Python generator waits before it opens again a connection that was refused.
_RECONNECT_PAUSE: Final = 0.01


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What one load run measured."""

    tool: str
    requests: int
    errors: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float


def _uses_wrk(tool: Tool) -> bool:
    if tool == "auto":
        chosen = os.environ.get("FORGEZERO_BENCH_LOAD", "auto")
        tool = chosen if chosen in ("wrk", "python") else "auto"  # type: ignore[assignment]
    return tool == "wrk" or (tool == "auto" and shutil.which("wrk") is not None)


def loader_name(tool: Tool = "auto") -> str:
    """The generator ``run_load(tool=tool)`` would use, as reported in the notes."""
    if _uses_wrk(tool):
        return f"wrk -t1 ({shutil.which('wrk')})"
    why = "wrk not installed" if shutil.which("wrk") is None else "FORGEZERO_BENCH_LOAD=python"
    return f"bench._load Python generator in a child process ({why})"


def run_load(
    url: str,
    *,
    seconds: float,
    connections: int = 32,
    requests: int | None = None,
    tool: Tool = "auto",
) -> LoadResult:
    """Load ``url`` for ``seconds`` (or until ``requests`` responses, Python only)."""
    _check(url, seconds, connections)
    if requests is None and _uses_wrk(tool):
        return _wrk(url, seconds, connections)
    command = [sys.executable, "-m", "bench._load", url, "--seconds", str(seconds)]
    command += ["--connections", str(connections)]
    if requests is not None:
        command += ["--requests", str(requests)]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=seconds + 30, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return LoadResult(**json.loads(done.stdout))


def _check(url: str, seconds: float, connections: int) -> None:
    host = urlsplit(url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"load goes to loopback only, not {host!r}")
    if not 0 < seconds <= _MAX_SECONDS or not 0 < connections <= _MAX_CONNECTIONS:
        raise ValueError(f"seconds in (0, {_MAX_SECONDS}], connections in 1..{_MAX_CONNECTIONS}")


def _wrk(url: str, seconds: float, connections: int) -> LoadResult:
    wrk = shutil.which("wrk") or "wrk"
    duration = f"{max(1, round(seconds))}s"
    command = [wrk, "-t1", f"-c{connections}", f"-d{duration}", "--latency", "--timeout", "5s"]
    done = subprocess.run(
        [*command, url], capture_output=True, text=True, timeout=seconds + 30, check=False
    )
    out = done.stdout
    rps, total = _WRK_RPS.search(out), _WRK_TOTAL.search(out)
    percentiles = {
        m.group(1): float(m.group(2)) * _TO_MS[m.group(3)] for m in _WRK_PCT.finditer(out)
    }
    if done.returncode != 0 or rps is None or total is None or len(percentiles) != 2:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{out[-2000:]}{done.stderr[-2000:]}")
    socket_errors = _WRK_SOCKET.search(out)
    errors = sum(map(int, socket_errors.groups())) if socket_errors else 0
    if match := _WRK_NON2XX.search(out):
        errors += int(match.group(1))
    elapsed = float(total.group(2)) * _TO_MS[total.group(3)] / 1000
    return LoadResult(
        "wrk",
        int(total.group(1)),
        errors,
        elapsed,
        float(rps.group(1)),
        percentiles["50"],
        percentiles["99"],
    )


# -- the Python generator (runs in the child process) ----------------------------------------


class _Shared:
    """State of one run shared by its connections (one event loop, no locks)."""

    __slots__ = ("budget", "deadline", "errors", "latencies")

    def __init__(self, deadline: float, budget: int | None) -> None:
        self.deadline = deadline
        self.budget = budget
        self.errors = 0
        self.latencies: list[float] = []

    def open(self) -> bool:
        """The run goes on: its time is not over and its budget not spent."""
        return time.perf_counter() < self.deadline and (self.budget is None or self.budget > 0)

    def take(self) -> bool:
        if time.perf_counter() >= self.deadline:
            return False
        if self.budget is None:
            return True
        if self.budget <= 0:
            return False
        self.budget -= 1
        return True


class _Connection(asyncio.Protocol):
    """One keep-alive connection: send, read one Content-Length response, repeat (until the
    server asks to close it)."""

    def __init__(self, request: bytes, shared: _Shared, done: asyncio.Future[None]) -> None:
        self._request = request
        self._shared = shared
        self._done = done
        self._buffer = bytearray()
        self._need = -1
        self._ok = False
        self._close = False
        self._in_flight = False
        self._sent_at = 0.0
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast("asyncio.Transport", transport)  # uvloop's is no subclass
        self._send()

    def _send(self) -> None:
        assert self._transport is not None
        if not self._shared.take():
            self._transport.close()
            return
        self._sent_at = time.perf_counter()
        self._in_flight = True
        self._transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        if self._need < 0:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buffer[:end]).lower()
            self._ok = head[9:10] == b"2"
            self._close = b"\r\nconnection: close" in head
            at = head.find(b"\r\ncontent-length:")
            if at < 0:
                self._fail()
                return
            stop = head.find(b"\r\n", at + 2)
            length = int(head[at + 17 : stop if stop >= 0 else len(head)])
            self._need = end + 4 + length
        if len(buffer) < self._need:
            return
        self._shared.latencies.append(time.perf_counter() - self._sent_at)
        if not self._ok:
            self._shared.errors += 1
        del buffer[: self._need]
        self._need = -1
        self._in_flight = False
        if self._close:
            assert self._transport is not None
            self._transport.close()  # the caller opens another connection
            return
        self._send()

    def _fail(self) -> None:
        self._shared.errors += 1
        if self._transport is not None:
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._in_flight:  # a request sent and not (wholly) answered
            self._shared.errors += 1
        if not self._done.done():
            self._done.set_result(None)


async def _generate(url: str, seconds: float, connections: int, requests: int | None) -> LoadResult:
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    request = f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode("ascii")
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    shared = _Shared(started + seconds, requests)

    async def connection(first: bool) -> None:
        """One of the ``connections``, opened again each time the server closes it."""
        while first or shared.open():
            first = False
            done: asyncio.Future[None] = loop.create_future()
            try:
                await loop.create_connection(
                    lambda done=done: _Connection(request, shared, done),  # type: ignore[misc]
                    parts.hostname or "127.0.0.1",
                    parts.port or 80,
                )
            except OSError:
                shared.errors += 1  # refused: counted, as wrk's connect errors
                await asyncio.sleep(_RECONNECT_PAUSE)
                continue
            await done

    await asyncio.wait_for(
        asyncio.gather(*(connection(True) for _ in range(connections))), seconds + 10
    )
    elapsed = time.perf_counter() - started
    latencies = sorted(shared.latencies)
    count = len(latencies)
    return LoadResult(
        "python",
        count,
        shared.errors,
        elapsed,
        count / elapsed,
        statistics.median(latencies) * 1000 if latencies else 0.0,
        latencies[min(count - 1, int(count * 0.99))] * 1000 if latencies else 0.0,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="bounded keep-alive GET load on a loopback URL")
    parser.add_argument("url")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--requests", type=int, default=None, help="stop after this many")
    args = parser.parse_args(argv)
    _check(args.url, args.seconds, args.connections)
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    result = runner(_generate(args.url, args.seconds, args.connections, args.requests))
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
