"""The generation-wide paths a worker checks before it hands a call to its supervisor.

Message level: hand-made scopes, a scripted ``receive`` and a recording ``send``; the supervisor
is the recording ``GenerationCall`` below (the seam ``ControlApp.for_generation`` takes), so each
test can say exactly what crossed to it, which is nothing for every refused request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from forgezero_lifecycle.asgi.control import BODY_SECONDS, Answer, ControlApp
from forgezero_lifecycle.core.drain import DrainController

from .test_control import AUTH, NONCE, TOKEN

pytestmark = pytest.mark.anyio

PREFIX = "/.forgezero/runtime/"


class Generation:
    """The supervisor's side of the seam: records each call, answers 200 ``{"ok": true}``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, object]]] = []

    async def __call__(self, call: str, arguments: dict[str, object]) -> Answer:
        self.calls.append((call, arguments))
        return Answer(200, b'{"ok":true}')


class _Untouched:
    """A drain controller's dependencies that no test here may reach: a forwarded path never
    drains (or reads) this worker's own runtime."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a forwarded path used the worker's own drain ({name})")


def _own_drain() -> DrainController:
    dependencies: Any = _Untouched()
    return DrainController(dependencies)


def control(generation: Generation, **options: Any) -> ControlApp:
    local = ControlApp(
        drain=_own_drain(),
        is_ready=lambda: True,
        intake_closed=lambda: False,
        **{"control_token": TOKEN, **options},
    )
    return local.for_generation(generation)


def scope(
    method: str,
    path: str,
    *,
    headers: Sequence[tuple[bytes, bytes]] = (),
    query: bytes = b"",
    client: str = "127.0.0.1",
) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": PREFIX + path,
        "raw_path": (PREFIX + path).encode(),
        "root_path": "",
        "query_string": query,
        "headers": [(b"host", b"127.0.0.1:8000"), *headers],
        "client": (client, 50000),
        "server": ("127.0.0.1", 8000),
    }


def bearer() -> tuple[bytes, bytes]:
    return (b"authorization", AUTH["authorization"].encode())


class Exchange:
    """A scripted ``receive`` (then one that never returns) and a recording ``send``."""

    def __init__(self, *bodies: bytes, finished: bool = True) -> None:
        self._messages = [
            {
                "type": "http.request",
                "body": body,
                "more_body": not finished or index < len(bodies) - 1,
            }
            for index, body in enumerate(bodies or (b"",))
        ]
        self.received = 0
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        self.received += 1
        if self._messages:
            return self._messages.pop(0)
        await asyncio.Event().wait()  # a client that sends nothing more and stays connected
        raise AssertionError("unreachable")

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def body(self) -> dict[str, Any]:
        document: dict[str, Any] = orjson.loads(self.sent[-1]["body"])
        return document


async def answer(app: ControlApp, request: dict[str, Any], exchange: Exchange) -> Exchange:
    """Run one request; a control plane that waits on the client forever fails the test."""
    async with asyncio.timeout(10):
        await app(request, exchange.receive, exchange.send)
    return exchange


async def test_status_is_typed_call() -> None:
    """Only the call and its arguments cross: no header, no query string, no body."""
    generation = Generation()
    app = control(generation)
    huge = (b"x-filler", b"\xff" * 100_000)
    request = scope("GET", "drain/v1/status", headers=[bearer(), huge], query=b"nonce=" + b"N" * 43)
    done = await answer(app, request, Exchange())
    assert (done.status, done.body) == (200, {"ok": True})
    assert generation.calls == [("drain.status", {"nonce": NONCE})]


async def test_unauthenticated_stays_out() -> None:
    """A 5 MiB header of 0xFF bytes without a token is a 401 in the worker."""
    generation = Generation()
    request = scope("GET", "drain/v1/current", headers=[(b"x-junk", b"\xff" * (5 << 20))])
    done = await answer(control(generation), request, Exchange())
    assert (done.status, done.body["error"]) == (401, "RUNTIME_UNAUTHORIZED")
    assert generation.calls == []


async def test_unauthenticated_body_unread() -> None:
    """A request whose body never ends gets its 401 without the worker waiting for the body."""
    generation = Generation()
    request = scope("POST", "drain/v1/begin", headers=[(b"content-type", b"application/json")])
    done = await answer(control(generation), request, Exchange(b"{", finished=False))
    assert (done.status, done.body["error"]) == (401, "RUNTIME_UNAUTHORIZED")
    assert generation.calls == []


async def test_trickling_body_refused() -> None:
    """An authenticated body that stops arriving is a 408 after the body's time bound."""
    generation = Generation()
    app = control(generation, body_timeout=0.05)
    headers = [bearer(), (b"content-type", b"application/json")]
    request = scope("POST", "drain/v1/begin", headers=headers)
    done = await answer(app, request, Exchange(b'{"protocol":', finished=False))
    assert (done.status, done.body["error"]) == (408, "RUNTIME_BODY_TIMEOUT")
    assert generation.calls == []
    assert BODY_SECONDS <= 10  # the default bound stays under any stop's margin


async def test_forwarded_get_reads_nothing() -> None:
    """The answer is sent without waiting on ``receive`` for more (it took a second each)."""
    generation = Generation()
    request = scope("GET", "drain/v1/current", headers=[bearer()])
    exchange = Exchange()
    await answer(control(generation), request, exchange)
    assert exchange.status == 200
    assert exchange.received <= 1


async def test_forwarded_begin_reads_once() -> None:
    """A forwarded begin reads its body once and nothing more."""
    generation = Generation()
    headers = [bearer(), (b"content-type", b"application/json")]
    exchange = Exchange(b'{"nonce":', b'"x"}')
    await answer(control(generation), scope("POST", "drain/v1/begin", headers=headers), exchange)
    assert exchange.status == 200
    assert exchange.received == 2
    assert generation.calls == [("drain.begin", {"request": {"nonce": "x"}})]


async def test_rebound_reload_refused() -> None:
    """``--insecure-loopback-control``: a Host that is not a loopback name (DNS rebinding) and a
    ``text/plain`` body (a page's form) never begin a handover."""
    generation = Generation()
    app = control(generation, control_token=None, loopback_only=True)
    rebound = scope(
        "POST",
        "supervisor/v1/reload",
        headers=[(b"host", b"evil.example"), (b"content-type", b"text/plain")],
    )
    rebound["headers"] = rebound["headers"][1:]  # the page's own Host only
    done = await answer(app, rebound, Exchange())
    assert (done.status, done.body["error"]) == (401, "RUNTIME_UNAUTHORIZED")
    plain = scope("POST", "supervisor/v1/reload", headers=[(b"content-type", b"text/plain")])
    done = await answer(app, plain, Exchange())
    assert (done.status, done.body["error"]) == (415, "RUNTIME_CONTENT_TYPE")
    assert generation.calls == []
    json = scope("POST", "supervisor/v1/reload", headers=[(b"content-type", b"application/json")])
    done = await answer(app, json, Exchange(b"{}"))
    assert done.status == 200
    assert generation.calls == [("reload", {})]


async def test_reload_takes_empty_object() -> None:
    """Reload takes the empty object only."""
    generation = Generation()
    headers = [bearer(), (b"content-type", b"application/json")]
    for body in (b'{"now":true}', b"[]", b"not json"):
        done = await answer(
            control(generation),
            scope("POST", "supervisor/v1/reload", headers=headers),
            Exchange(body),
        )
        assert (done.status, done.body["error"]) == (400, "RUNTIME_DRAIN_REQUEST_INVALID"), body
    assert generation.calls == []


@pytest.mark.parametrize("wanted", [b"9" * 5000, b"x", b"-1", b"1.5", "\u0661".encode()])
async def test_unknown_handover_not_found(wanted: bytes) -> None:
    """5,000 digits, or anything but 1 to 9 ASCII digits: 404, never a 500."""
    generation = Generation()
    request = scope(
        "GET", "supervisor/v1/handover", headers=[bearer()], query=b"handover=" + wanted
    )
    done = await answer(control(generation), request, Exchange())
    assert (done.status, done.body["error"]) == (404, "RUNTIME_NOT_FOUND")
    assert generation.calls == []


async def test_handover_number_is_int() -> None:
    """A handover number crosses as an integer."""
    generation = Generation()
    request = scope("GET", "supervisor/v1/handover", headers=[bearer()], query=b"handover=12")
    await answer(control(generation), request, Exchange())
    assert generation.calls == [("handover", {"number": 12})]


async def test_long_nonce_not_found() -> None:
    """A nonce longer than any drain has is not found in the worker."""
    generation = Generation()
    request = scope("GET", "drain/v1/status", headers=[bearer()], query=b"nonce=" + b"N" * 5000)
    done = await answer(control(generation), request, Exchange())
    assert (done.status, done.body["error"]) == (404, "RUNTIME_DRAIN_NOT_FOUND")
    assert generation.calls == []


async def test_one_process_reload_hint() -> None:
    """Without a supervisor the supervisor's paths are 404, naming ``serve --workers``."""
    local = ControlApp(
        drain=_own_drain(),
        is_ready=lambda: True,
        intake_closed=lambda: False,
        control_token=TOKEN,
    )
    headers = [bearer(), (b"content-type", b"application/json")]
    for method, path in (("POST", "supervisor/v1/reload"), ("GET", "supervisor/v1/handover")):
        done = await answer(local, scope(method, path, headers=headers), Exchange(b"{}"))
        assert (done.status, done.body["error"]) == (404, "RUNTIME_NOT_FOUND")
        assert "serve --workers" in done.body["detail"]
