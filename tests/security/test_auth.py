"""Authentication of the control plane, and tokens that never show in logs, status or errors.

Every endpoint that needs a token is tried without one, with a wrong one, with the other kind
(the handoff token where the control token belongs, and the reverse), with a prefix or an
extension of the right one and in the wrong place: each gets 401 with ``WWW-Authenticate:
Bearer``, and nothing changes. A whole drain and handoff between two runtimes (the old one served
by a real uvicorn on loopback) is then run with every log record captured at DEBUG: neither
token, nor the handed-over value, appears in a log line, a status or an error body.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

import httpx
import pytest
import uvicorn

from forgezero_lifecycle.core._httpx import tls_context
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.wire import paths
from tests.real_servers._servers import free_port

from ._asgi import CONTROL_TOKEN, HANDOFF_TOKEN, REVISION, NoteState, inner_app, make_runtime

pytestmark = pytest.mark.anyio

OTHER_REVISION: Final = "c" * 40
NONCE: Final = "N" * 43
VALUE_MARKER: Final = "handed-over-value-7f3a9c"

DRAIN_BODY: Final = {
    "protocol": "forgezero-drain/v1",
    "nonce": NONCE,
    "sourceRevision": REVISION,
    "targetRevision": OTHER_REVISION,
    "timeoutMs": 5000,
}


def _handoff_body(url: str, token: str = HANDOFF_TOKEN) -> dict[str, Any]:
    return {
        "protocol": "tests.security.note",
        "nonce": "H" * 43,
        "schemaVersion": 1,
        "sourceRevision": REVISION,
        "targetRevision": OTHER_REVISION,
        "source": {"url": url, "authorization": f"Bearer {token}"},
        "timeoutMs": 5000,
    }


#: name -> (headers, query) of each wrong way to present a token, given the right token and
#: the token of the other kind.
def _bad_presentations(right: str, other: str) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    return {
        "no-token": ({}, {}),
        "wrong-token": ({"authorization": "Bearer wrong-token-0123456789abcdefghijklmno"}, {}),
        "other-kind": ({"authorization": f"Bearer {other}"}, {}),
        "prefix": ({"authorization": f"Bearer {right[:-1]}"}, {}),
        "short-prefix": ({"authorization": f"Bearer {right[:4]}"}, {}),
        "extended": ({"authorization": f"Bearer {right}0"}, {}),
        "case-changed": ({"authorization": f"Bearer {right.upper()}"}, {}),
        "empty-bearer": ({"authorization": "Bearer "}, {}),
        "basic-scheme": ({"authorization": f"Basic {right}"}, {}),
        "no-scheme": ({"authorization": right}, {}),
        "two-spaces": ({"authorization": f"Bearer  {right}"}, {}),
        "in-query": ({}, {"token": right, "access_token": right}),
        "other-header": ({"x-api-key": right, "proxy-authorization": f"Bearer {right}"}, {}),
    }


CONTROL_BAD: Final = _bad_presentations(CONTROL_TOKEN, HANDOFF_TOKEN)
HANDOFF_BAD: Final = _bad_presentations(HANDOFF_TOKEN, CONTROL_TOKEN)


@contextlib.asynccontextmanager
async def _client(runtime_app: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=runtime_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        yield http


def _assert_unauthorized(
    response: httpx.Response, presented: tuple[dict[str, str], dict[str, str]]
) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    body = response.json()
    assert body["error"] == "RUNTIME_UNAUTHORIZED"
    assert set(body) <= {"error", "detail"}
    for secret in (CONTROL_TOKEN, HANDOFF_TOKEN, *presented[0].values(), *presented[1].values()):
        if len(secret) > 8:  # short fragments like "Bearer " may occur in a detail sentence
            assert secret not in response.text


def _state(runtime: Runtime, note: NoteState) -> tuple[object, ...]:
    status = runtime.drain.status(NONCE).status if runtime.drain.active else None
    return (
        runtime.drain.active,
        runtime.draining.is_set(),
        runtime.gate.is_open,
        status,
        note.imported,
    )


async def _no_handoff_started(runtime: Runtime) -> None:
    """A fresh handoff begin is accepted as new: nothing was started before it."""
    assert runtime.handoff is not None
    body = _handoff_body("http://127.0.0.1:9/x")
    timeout = body.pop("timeoutMs")
    assert runtime.handoff.begin({**body, "nonce": "Q" * 43}, timeout) == {
        "accepted": True,
        "duplicate": False,
    }
    await runtime.aclose()


@pytest.mark.parametrize("drained", [False, True], ids=["serving", "drained"])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        (paths.RUNTIME_DRAIN_BEGIN_PATH, {**DRAIN_BODY, "nonce": "B" * 43}),
        (paths.RUNTIME_DRAIN_ROLLBACK_PATH, {"nonce": NONCE}),
        (paths.RUNTIME_STATE_BEGIN_PATH, _handoff_body("http://127.0.0.1:9/x")),
    ],
    ids=["drain-begin", "drain-rollback", "state-begin"],
)
@pytest.mark.parametrize("bad", CONTROL_BAD.values(), ids=CONTROL_BAD.keys())
async def test_write_without_token_401(
    path: str, body: dict[str, Any], bad: tuple[dict[str, str], dict[str, str]], drained: bool
) -> None:
    """A valid body with a bad token: 401, and no drain, rollback or handoff happens."""
    note = NoteState()
    runtime, app = make_runtime(note)
    if drained:
        runtime.drain.begin(DRAIN_BODY)
        assert await runtime.drain.wait() == "drained"
    before = _state(runtime, note)
    async with _client(app) as http:
        response = await http.post(path, json=body, headers=bad[0], params=bad[1])
    _assert_unauthorized(response, bad)
    assert _state(runtime, note) == before
    await _no_handoff_started(runtime)
    if drained:
        runtime.drain.rollback(NONCE)


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        (paths.RUNTIME_DRAIN_STATUS_PATH, "control"),
        (paths.RUNTIME_DRAIN_CURRENT_PATH, "control"),
        (paths.RUNTIME_STATE_STATUS_PATH, "control"),
        (paths.RUNTIME_SCHEDULES_STATUS_PATH, "control"),
        (paths.RUNTIME_STATE_EXPORT_PATH, "handoff"),
    ],
    ids=["drain-status", "drain-current", "state-status", "schedules-status", "state-export"],
)
@pytest.mark.parametrize("bad", list(CONTROL_BAD), ids=list(CONTROL_BAD))
async def test_read_without_token_401(path: str, kind: str, bad: str) -> None:
    """Status and export reveal nothing without their own token (the other kind included)."""
    note = NoteState()
    runtime, app = make_runtime(note)
    runtime.drain.begin(DRAIN_BODY)  # drained: an export with the right token would succeed
    assert await runtime.drain.wait() == "drained"
    presented = (CONTROL_BAD if kind == "control" else HANDOFF_BAD)[bad]
    query = {"nonce": NONCE, "sourceRevision": REVISION, "targetRevision": OTHER_REVISION}
    async with _client(app) as http:
        response = await http.get(path, headers=presented[0], params={**query, **presented[1]})
    _assert_unauthorized(response, presented)
    assert note.exports == 0
    runtime.drain.rollback(NONCE)


class _QuietServer(uvicorn.Server):
    """uvicorn inside the test's event loop, leaving the process's signal handlers alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def _served(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` on a loopback port in this event loop; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="debug", lifespan="off")
    server = _QuietServer(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:  # noqa: ASYNC110 - uvicorn's own flag
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def test_tokens_never_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A full drain + handoff + rollback, good and bad calls: no token or value leaks anywhere."""
    caplog.set_level(logging.DEBUG)
    old_note = NoteState(VALUE_MARKER)
    old, old_app = make_runtime(old_note)
    # Two new generations: the first is given a wrong handoff token, the second the right one.
    failing_note, taking_note = NoteState(), NoteState()
    failing = Runtime(control_token=CONTROL_TOKEN, revision="d" * 40, state_adapter=failing_note)
    taking = Runtime(control_token=CONTROL_TOKEN, revision="e" * 40, state_adapter=taking_note)
    control = {"authorization": f"Bearer {CONTROL_TOKEN}"}
    wrong_token = "w" * 43
    seen: list[str] = []

    async def ask(http: httpx.AsyncClient, method: str, path: str, **kwargs: Any) -> None:
        reply = await http.request(method, path, **kwargs)
        seen.append(f"{reply.status_code} {reply.headers} {reply.text}")

    async with (
        _served(old_app) as old_url,
        httpx.AsyncClient(base_url=old_url, trust_env=False, verify=tls_context()) as old_http,
        _client(failing.wrap(inner_app)) as failing_http,
        _client(taking.wrap(inner_app)) as taking_http,
    ):
        await ask(
            old_http, "POST", paths.RUNTIME_DRAIN_BEGIN_PATH, json=DRAIN_BODY, headers=control
        )
        bad_kind = {"authorization": f"Bearer {HANDOFF_TOKEN}"}
        await ask(
            old_http, "POST", paths.RUNTIME_DRAIN_BEGIN_PATH, json=DRAIN_BODY, headers=bad_kind
        )
        await ask(
            old_http,
            "POST",
            paths.RUNTIME_DRAIN_BEGIN_PATH,
            json={**DRAIN_BODY, "timeoutMs": 1},
            headers=control,
        )
        await ask(
            old_http,
            "GET",
            paths.RUNTIME_DRAIN_STATUS_PATH,
            params={"nonce": NONCE},
            headers=control,
        )
        export = f"{old_url}{paths.RUNTIME_STATE_EXPORT_PATH}?sourceRevision={REVISION}&targetRevision={OTHER_REVISION}"
        for http, runtime, token in (
            (failing_http, failing, wrong_token),
            (taking_http, taking, HANDOFF_TOKEN),
        ):
            body = _handoff_body(export, token=token)
            await ask(http, "POST", paths.RUNTIME_STATE_BEGIN_PATH, json=body, headers=control)
            assert runtime.handoff is not None
            seen.append(repr(await runtime.handoff.wait("H" * 43)))
            await ask(
                http,
                "GET",
                paths.RUNTIME_STATE_STATUS_PATH,
                params={"nonce": "H" * 43},
                headers=control,
            )
        await ask(
            old_http,
            "POST",
            paths.RUNTIME_DRAIN_ROLLBACK_PATH,
            json={"nonce": NONCE},
            headers=control,
        )
    for runtime in (old, failing, taking):
        await runtime.aclose()

    assert failing_note.imported is None
    assert taking_note.imported is not None
    assert taking_note.imported.text == VALUE_MARKER
    assert "RUNTIME_STATE_SOURCE_HTTP_401" in seen[5]
    logged = caplog.text + "".join(repr(record.args) for record in caplog.records)
    assert any(r.name.startswith("forgezero_lifecycle") for r in caplog.records)
    for secret in (CONTROL_TOKEN, HANDOFF_TOKEN, wrong_token, VALUE_MARKER):
        assert secret not in logged
        assert [text for text in seen if secret in text] == []
