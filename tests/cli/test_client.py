"""The control client at the HTTP level (httpx.MockTransport): bodies, errors, retries, tokens."""

from __future__ import annotations

import inspect
import logging
import ssl
from collections.abc import Callable

import httpx
import orjson
import pytest

from forgezero_lifecycle._errors import (
    ConfigurationError,
    ControlUnreachableError,
    DrainConflictError,
    DrainNotFoundError,
    RemoteError,
    UnauthorizedError,
)
from forgezero_lifecycle.client import (
    ControlClient,
    SyncControlClient,
    drain_request,
    handoff_request,
    new_nonce,
)
from forgezero_lifecycle.wire._types import is_nonce

from .conftest import CONTROL_TOKEN, HANDOFF_TOKEN, REVISION_A, REVISION_B

URL = "http://127.0.0.1:9"
Handler = Callable[[httpx.Request], httpx.Response]


def _status(state: str = "draining", nonce: str | None = None) -> dict[str, object]:
    return {
        "protocol": "forgezero-drain/v1",
        "nonce": nonce or new_nonce(),
        "sourceRevision": REVISION_A,
        "targetRevision": REVISION_B,
        "timeoutMs": 1000,
        "status": state,
        "inFlight": {"http": 1, "websocket": 0, "jobs": 0, "schedules": 0},
    }


def _client(handler: Handler, **options: object) -> ControlClient:
    transport = httpx.MockTransport(handler)
    return ControlClient(
        URL, token=CONTROL_TOKEN, transport=transport, **options
    )  # deliberately the wrong type: the test is about refusing it


def _json(status: int, body: object) -> httpx.Response:
    return httpx.Response(status, content=orjson.dumps(body))


def test_nonces_are_fresh_and_valid() -> None:
    """`secrets.token_urlsafe(32)`: 43 base64url characters, never repeated, never a flag."""
    nonces = {new_nonce() for _ in range(2000)}
    assert len(nonces) == 2000
    assert all(is_nonce(nonce) and not nonce.startswith("-") for nonce in nonces)


@pytest.mark.anyio
async def test_begin_drain_request() -> None:
    """begin_drain sends the wire request with the token: camelCase JSON body,
    `Authorization: Bearer`, `Content-Type: application/json`."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _json(202, {"accepted": True, "duplicate": False})

    request = drain_request(source_revision=REVISION_A, target_revision=REVISION_B, timeout_ms=5000)
    async with _client(handler) as client:
        accepted = await client.begin_drain(request)
    assert accepted.duplicate is False
    sent = seen[0]
    assert sent.url.path == "/.forgezero/runtime/drain/v1/begin"
    assert sent.headers["authorization"] == f"Bearer {CONTROL_TOKEN}"
    assert sent.headers["content-type"] == "application/json"
    assert orjson.loads(sent.content) == {
        "protocol": "forgezero-drain/v1",
        "nonce": request.nonce,
        "sourceRevision": REVISION_A,
        "targetRevision": REVISION_B,
        "timeoutMs": 5000,
    }


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "code", "error_type"),
    [
        (409, "RUNTIME_DRAIN_ALREADY_STARTED", DrainConflictError),
        (404, "RUNTIME_DRAIN_NOT_FOUND", DrainNotFoundError),
        (401, "RUNTIME_UNAUTHORIZED", UnauthorizedError),
        (400, "RUNTIME_SOMETHING_NEWER", RemoteError),
    ],
)
async def test_error_bodies_typed(status: int, code: str, error_type: type[Exception]) -> None:
    """`{"error": CODE}` raises the library's error for CODE, once (never retried)."""
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return _json(status, {"error": code, "detail": "what to do"})

    async with _client(handler) as client:
        with pytest.raises(error_type) as raised:
            await client.drain_status(new_nonce())
    assert raised.value.code == code
    assert raised.value.detail == "what to do"
    assert len(calls) == 1


@pytest.mark.anyio
async def test_connection_failure_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Transport errors are retried `retries` times, then ControlUnreachableError; no token logged."""
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError("connection refused", request=request)

    caplog.set_level(logging.DEBUG)
    async with _client(handler, retries=2) as client:
        with pytest.raises(ControlUnreachableError) as raised:
            await client.rollback(new_nonce())
    assert len(calls) == 3
    assert raised.value.code == "RUNTIME_UNREACHABLE"
    assert CONTROL_TOKEN not in str(raised.value)
    assert CONTROL_TOKEN not in caplog.text


@pytest.mark.anyio
async def test_gateway_errors_retried() -> None:
    """Gateway errors are retried and then reported: a 502 without a control-plane body (a proxy) is
    retried; the next answer wins."""
    answers = [httpx.Response(502, text="bad gateway"), _json(200, _status("drained"))]

    def handler(request: httpx.Request) -> httpx.Response:
        return answers.pop(0)

    async with _client(handler) as client:
        status = await client.drain_status(new_nonce())
    assert status.status == "drained"

    def always_502(request: httpx.Request) -> httpx.Response:
        return httpx.Response(502, text="bad gateway")

    async with _client(always_502, retries=1) as client:
        with pytest.raises(RemoteError) as raised:
            await client.drain_status(new_nonce())
    assert raised.value.code == "RUNTIME_HTTP_502"


@pytest.mark.anyio
async def test_unexpected_200_body() -> None:
    """A 200 that is not a status (a wrong URL, say) is RUNTIME_RESPONSE_INVALID."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>hello</html>")

    async with _client(handler) as client:
        with pytest.raises(RemoteError) as raised:
            await client.drain_status(new_nonce())
    assert raised.value.code == "RUNTIME_RESPONSE_INVALID"


@pytest.mark.anyio
async def test_wait_drained_progress() -> None:
    """wait_drained reports progress until final: `on_progress` sees each polled status; the final
    one is returned."""
    nonce = new_nonce()
    states = ["draining", "draining", "drained"]

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.params["nonce"] == nonce
        return _json(200, _status(states.pop(0), nonce))

    seen: list[str] = []
    async with _client(handler) as client:
        final = await client.wait_drained(
            nonce, on_progress=lambda s: seen.append(s.status), poll_interval=0.001
        )
    assert final.status == "drained"
    assert seen == ["draining", "draining", "drained"]


@pytest.mark.anyio
async def test_reload_and_wait_handover() -> None:
    """``reload`` gives the handover's number; ``wait_handover`` asks for it by number, with the
    control token, until it is no longer running."""
    states = ["running", "running", "done"]
    asked: list[tuple[str, str, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append((request.method, request.url.path, request.url.params.get("handover")))
        assert request.headers["authorization"] == f"Bearer {CONTROL_TOKEN}"
        if request.method == "POST":
            return _json(202, {"accepted": True, "handover": 3})
        state = states.pop(0)
        return _json(
            200,
            {
                "handover": 3,
                "state": state,
                "fromGeneration": 2,
                "toGeneration": 3,
                "detail": None,
                "seconds": 2.5 if state == "done" else None,
            },
        )

    async with _client(handler) as client:
        accepted = await client.reload()
        final = await client.wait_handover(accepted.handover, poll_interval=0.001)
    assert (final.state, final.to_generation, final.seconds) == ("done", 3, 2.5)
    supervisor = "/.forgezero/runtime/supervisor/v1/"
    assert asked == [
        ("POST", supervisor + "reload", None),
        *[("GET", supervisor + "handover", "3")] * 3,
    ]


@pytest.mark.anyio
async def test_current_drain_no_nonce() -> None:
    """current_drain() GETs drain/v1/current with the control token; 404 is DrainNotFoundError."""
    nonce = new_nonce()
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1:
            return _json(200, _status("draining", nonce))
        return _json(404, {"error": "RUNTIME_DRAIN_NOT_FOUND", "detail": "no drain is running"})

    async with _client(handler) as client:
        assert (await client.current_drain()).nonce == nonce
        with pytest.raises(DrainNotFoundError):
            await client.current_drain()
    assert seen[0].url.path == "/.forgezero/runtime/drain/v1/current"
    assert not seen[0].url.query
    assert seen[0].headers["authorization"] == f"Bearer {CONTROL_TOKEN}"


@pytest.mark.anyio
async def test_probe_export_credentials() -> None:
    """Probes carry no token; export carries the handoff token, not the control token."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/ready"):
            return _json(503, {"ready": False, "status": "draining"})
        return _json(
            200,
            {
                "protocol": "demo.counter",
                "schemaVersion": 1,
                "sourceRevision": REVISION_A,
                "targetRevision": REVISION_B,
                "cursor": "c-1",
                "digest": "sha256:" + "0" * 64,
                "value": {"count": 1},
            },
        )

    transport = httpx.MockTransport(handler)
    async with ControlClient(
        URL, token=CONTROL_TOKEN, handoff_token=HANDOFF_TOKEN, transport=transport
    ) as client:
        assert await client.ready() is False
        envelope = await client.export_state(REVISION_A, REVISION_B)
    assert envelope.cursor == "c-1"
    assert "authorization" not in seen[0].headers
    assert seen[1].headers["authorization"] == f"Bearer {HANDOFF_TOKEN}"
    assert seen[1].url.params["sourceRevision"] == REVISION_A


@pytest.mark.anyio
async def test_begin_handoff_timeout() -> None:
    """The begin body is the handoff request plus `timeoutMs`; repr never shows the token."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _json(202, {"accepted": True, "duplicate": True})

    request = handoff_request(
        protocol="demo.counter",
        schema_version=1,
        source_revision=REVISION_A,
        target_revision=REVISION_B,
        source_url="http://127.0.0.1:1/.forgezero/runtime/state/v1/export",
        handoff_token=HANDOFF_TOKEN,
    )
    assert HANDOFF_TOKEN not in repr(request)
    async with _client(handler) as client:
        accepted = await client.begin_handoff(request, timeout_ms=2500)
    assert accepted.duplicate is True
    body = orjson.loads(seen[0].content)
    assert body["timeoutMs"] == 2500
    assert body["source"]["authorization"] == f"Bearer {HANDOFF_TOKEN}"
    assert body["schemaVersion"] == 1


def test_url_credentials_refused() -> None:
    """URLs with credentials are refused: tokens never travel in the URL, where logs and errors
    would show them."""
    with pytest.raises(ConfigurationError):
        ControlClient("http://user:secret@127.0.0.1:1")
    with pytest.raises(ConfigurationError):
        ControlClient("127.0.0.1:1")


def test_sync_facade_same_calls() -> None:
    """The blocking facade for scripts returns the same wire models."""
    nonce = new_nonce()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/begin"):
            return _json(202, {"accepted": True, "duplicate": False})
        return _json(200, _status("drained", nonce))

    request = drain_request(
        source_revision=REVISION_A, target_revision=REVISION_B, timeout_ms=1000, nonce=nonce
    )
    with SyncControlClient(
        URL, token=CONTROL_TOKEN, transport=httpx.MockTransport(handler)
    ) as client:
        assert client.begin_drain(request).duplicate is False
        assert client.wait_drained(nonce, timeout=5.0).status == "drained"
        assert client.drain_status(nonce).in_flight.http == 1
        assert client.current_drain().nonce == nonce


def _calls(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls, inspect.isfunction) if name[0] != "_"}


def test_sync_facade_signatures() -> None:
    """SyncControlClient takes ControlClient's options and has each of its calls, alike but for
    the waits' ``timeout``, so the two cannot drift apart."""
    assert _calls(SyncControlClient) - {"close"} == _calls(ControlClient) - {"aclose"}
    assert inspect.signature(SyncControlClient) == inspect.signature(ControlClient)
    timeout = inspect.Parameter(
        "timeout", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="float | None"
    )
    for name in _calls(ControlClient) - {"aclose"}:
        expected = inspect.signature(getattr(ControlClient, name))
        if name.startswith("wait_"):
            expected = expected.replace(parameters=[*expected.parameters.values(), timeout])
        assert inspect.signature(getattr(SyncControlClient, name)) == expected, name


@pytest.mark.anyio
async def test_clients_share_one_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control clients after the first load no CA bundle (httpx's default loads certifi's for
    every client: about 20 ms of CPU each); one with a transport of its own loads none."""
    ControlClient("http://127.0.0.1:1")  # the process's first: builds the shared context
    loaded: list[object] = []
    original = ssl.SSLContext.load_verify_locations

    def counted(
        context: ssl.SSLContext,
        cafile: str | None = None,
        capath: str | None = None,
        cadata: str | bytes | None = None,
    ) -> None:
        loaded.append(cafile or capath or cadata)
        original(context, cafile, capath, cadata)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    for _ in range(3):
        await ControlClient("https://127.0.0.1:1").aclose()
    await ControlClient("http://127.0.0.1:1", transport=httpx.MockTransport(_refuse)).aclose()
    assert loaded == []


def _refuse(request: httpx.Request) -> httpx.Response:
    return httpx.Response(503)
