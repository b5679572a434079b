"""Property-based fuzzing of every control endpoint, at the ASGI message level, in process.

Each generated example is one request (random method, path, headers, content type, JSON or
non-JSON body, split across messages) sent to a fresh runtime that is either serving or already
drained. The rules: never a 5xx; every error is ``{"error": CODE}`` (plus an optional ``detail``)
with the status and code the design documents for that endpoint, in the documented order (404
path, 405 method, 401 token, 415 type, 413 size, then the endpoint's own); a 2xx on a
state-changing endpoint only with the right token; and without one nothing changes (no drain
begun or rolled back, no handoff started, nothing imported). Tokens never appear in an answer or
a log line. ``FORGEZERO_SOAK=1`` generates 10,000 requests instead of a few hundred.

Inputs a compliant server never delivers (a raw non-ASCII byte in the query string, a
Content-Length of non-ASCII digits) and a client hanging up mid-body are kept out of the fuzz;
the tests at the end of this file pin them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import string
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote, unquote

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.wire import paths
from tests.reliability._soak import report, scale

from ._asgi import CONTROL_TOKEN, HANDOFF_TOKEN, REVISION, Answer, NoteState, call, make_runtime

EXAMPLES: Final = scale(400, 10_000)
MAX_BODY: Final = 16 * 1024
PRE_NONCE: Final = "P" * 43
OTHER_REVISION: Final = "b" * 40

#: path -> (method, token kind, {status: allowed codes}): the README's wire protocol table.
ROUTES: Final[dict[str, tuple[str, str, dict[int, set[str]]]]] = {
    paths.RUNTIME_DRAIN_BEGIN_PATH: (
        "POST",
        "control",
        {
            400: {"RUNTIME_DRAIN_REQUEST_INVALID"},
            409: {"RUNTIME_DRAIN_ALREADY_STARTED", "RUNTIME_DRAIN_REVISION_MISMATCH"},
        },
    ),
    paths.RUNTIME_DRAIN_STATUS_PATH: ("GET", "control", {404: {"RUNTIME_DRAIN_NOT_FOUND"}}),
    paths.RUNTIME_DRAIN_CURRENT_PATH: ("GET", "control", {404: {"RUNTIME_DRAIN_NOT_FOUND"}}),
    paths.RUNTIME_DRAIN_ROLLBACK_PATH: (
        "POST",
        "control",
        {400: {"RUNTIME_DRAIN_REQUEST_INVALID"}, 404: {"RUNTIME_DRAIN_NOT_FOUND"}},
    ),
    paths.RUNTIME_STATE_EXPORT_PATH: (
        "GET",
        "handoff",
        {
            400: {"RUNTIME_STATE_REVISION_INVALID"},
            409: {"RUNTIME_STATE_NOT_DRAINING", "RUNTIME_STATE_REVISION_MISMATCH"},
            413: {"RUNTIME_STATE_EXPORT_TOO_LARGE"},
            422: {"RUNTIME_STATE_EXPORT_INVALID"},
        },
    ),
    paths.RUNTIME_STATE_BEGIN_PATH: (
        "POST",
        "control",
        {
            400: {"RUNTIME_STATE_REQUEST_INVALID", "RUNTIME_STATE_SOURCE_INVALID"},
            409: {"RUNTIME_STATE_ALREADY_STARTED"},
        },
    ),
    paths.RUNTIME_STATE_STATUS_PATH: ("GET", "control", {404: {"RUNTIME_STATE_NOT_FOUND"}}),
    paths.RUNTIME_SCHEDULES_STATUS_PATH: ("GET", "control", {}),
    paths.RUNTIME_READY_PATH: ("GET", "none", {}),
    paths.RUNTIME_LIVE_PATH: ("GET", "none", {}),
}
STATE_CHANGING: Final = {
    paths.RUNTIME_DRAIN_BEGIN_PATH,
    paths.RUNTIME_DRAIN_ROLLBACK_PATH,
    paths.RUNTIME_STATE_BEGIN_PATH,
}
TOKENS: Final = {"control": CONTROL_TOKEN, "handoff": HANDOFF_TOKEN}

# -- strategies ---------------------------------------------------------------------------------

_URL_SAFE = string.ascii_letters + string.digits + "-._~/%!$&'()*+,;=:@"

raw_paths = st.one_of(
    st.sampled_from(sorted(ROUTES)),
    st.sampled_from(sorted(ROUTES)).map(lambda p: p + "/"),
    st.sampled_from(sorted(ROUTES)).map(lambda p: p.upper()),
    st.sampled_from(sorted(ROUTES)).map(lambda p: p.replace("/v1/", "/v2/")),
    st.sampled_from(sorted(ROUTES)).map(lambda p: p.replace("/", "//", 2)),
    st.sampled_from(sorted(ROUTES)).map(lambda p: quote(p, safe="")),
    st.text(_URL_SAFE, max_size=40).map(lambda t: paths.CONTROL_PREFIX + t),
)
methods = st.one_of(
    st.sampled_from(["GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"]),
    st.text(string.ascii_letters, min_size=1, max_size=12),
)
authorizations = st.one_of(
    st.none(),
    st.sampled_from(
        [
            f"Bearer {CONTROL_TOKEN}",
            f"Bearer {HANDOFF_TOKEN}",
            f"bearer {CONTROL_TOKEN}",
            f"BEARER {HANDOFF_TOKEN}",
            f"Bearer  {CONTROL_TOKEN}",
            f"Bearer {CONTROL_TOKEN[:-1]}",
            f"Bearer {CONTROL_TOKEN[:8]}",
            f"Bearer {CONTROL_TOKEN}x",
            f"Bearer {CONTROL_TOKEN} ",
            f"Bearer {HANDOFF_TOKEN[:-1]}",
            f"Basic {CONTROL_TOKEN}",
            f"{CONTROL_TOKEN}",
            "Bearer",
            "Bearer ",
        ]
    ).map(str.encode),
    st.binary(max_size=60).filter(lambda b: all(c >= 0x20 for c in b)),
)
content_types = st.one_of(
    st.none(),
    st.sampled_from(
        [
            b"application/json",
            b"application/json; charset=utf-8",
            b"APPLICATION/JSON",
            b" application/json ;x=1",
            b"application/jsonx",
            b"text/plain",
            b"application/x-www-form-urlencoded",
            b"multipart/form-data; boundary=x",
            b"application/problem+json",
        ]
    ),
    st.binary(max_size=40).filter(lambda b: all(c >= 0x20 for c in b)),
)
content_lengths = st.one_of(
    st.none(),
    st.just("correct"),
    st.integers(0, 10**12).map(lambda n: str(n).encode()),
    st.text(string.digits + string.ascii_letters + "+- .", min_size=1, max_size=12).map(str.encode),
)
_valid_nonces = st.text(string.ascii_letters + string.digits + "_-", min_size=43, max_size=43)
nonces = st.one_of(
    st.just(PRE_NONCE),
    _valid_nonces,
    _valid_nonces,
    _valid_nonces,
    st.text(max_size=50),
    st.integers(),
    st.none(),
    st.lists(st.just(PRE_NONCE), max_size=2),
)
revisions = st.one_of(
    st.just(REVISION),
    st.just(REVISION),
    st.just(OTHER_REVISION),
    st.text(max_size=42),
    st.integers(),
    st.none(),
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _dumps(value: Any) -> bytes:
    """JSON text of ``value`` as UTF-8; big integers, Infinity and lone surrogates included."""
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly ``value``, sometimes any JSON value (one_of picks its branches evenly)."""
    return st.one_of(value, value, value, json_values)


drain_bodies = st.fixed_dictionaries(
    {
        "protocol": _maybe(st.just("forgezero-drain/v1")),
        "nonce": _maybe(nonces),
        "sourceRevision": _maybe(revisions),
        "targetRevision": _maybe(revisions),
        "timeoutMs": _maybe(
            st.one_of(
                st.integers(100, 600_000), st.integers(-10, 10**7), st.floats(), st.just(1e400)
            )
        ),
    },
    optional={"extra": json_values},
)
handoff_bodies = st.fixed_dictionaries(
    {
        "protocol": _maybe(st.just("tests.security.note")),
        "nonce": _maybe(nonces),
        "schemaVersion": _maybe(st.just(1)),
        "sourceRevision": _maybe(revisions),
        "targetRevision": _maybe(revisions),
        "source": _maybe(
            st.fixed_dictionaries(
                {
                    "url": _maybe(
                        st.sampled_from(
                            [
                                "http://127.0.0.1:9/x",
                                "http://169.254.169.254/",
                                "https://127.0.0.1/",
                                "http://u:p@127.0.0.1/",
                                "http://127.0.0.1/#f",
                            ]
                        )
                    ),
                    "authorization": _maybe(st.just(f"Bearer {HANDOFF_TOKEN}")),
                }
            )
        ),
        "timeoutMs": _maybe(st.integers(0, 700_000)),
    }
)
raw_bodies = st.one_of(
    drain_bodies.map(_dumps),
    handoff_bodies.map(_dumps),
    st.fixed_dictionaries({"nonce": nonces}).map(_dumps),
    json_values.map(_dumps),
    st.integers(1, 6000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 6000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    st.integers(300, 5000).map(lambda n: b'{"timeoutMs":1' + b"0" * n + b"}"),
    st.sampled_from([b'{"nonce":"\xff\xfe"}', b"\xef\xbb\xbf{}", b'{"a":NaN}', b"", b"{", b"null"]),
    st.binary(max_size=300),
    st.integers(MAX_BODY - 10, MAX_BODY * 3).map(lambda n: b'{"a":"' + b"x" * n + b'"}'),
)
query_strings = st.one_of(
    st.just(b""),
    st.builds(lambda n: ("nonce=" + quote(str(n), safe="")).encode(), nonces),
    st.builds(
        lambda s, t: (
            f"sourceRevision={quote(str(s), safe='')}&targetRevision={quote(str(t), safe='')}".encode()
        ),
        revisions,
        revisions,
    ),
    st.text(_URL_SAFE + "=&", max_size=60).map(str.encode),
)
extra_headers = st.lists(
    st.tuples(
        st.text(string.ascii_lowercase + "-", min_size=1, max_size=12).map(str.encode),
        st.binary(max_size=30).filter(lambda b: all(c >= 0x20 for c in b)),
    ),
    max_size=3,
)


@dataclass(frozen=True)
class Example:
    pre: str
    method: str
    raw_path: str
    query: bytes
    authorization: bytes | None
    content_type: bytes | None
    content_length: bytes | str | None
    body: bytes
    cuts: tuple[int, ...]
    extra: tuple[tuple[bytes, bytes], ...]

    def headers(self) -> list[tuple[bytes, bytes]]:
        headers = [(b"host", b"127.0.0.1")]
        if self.authorization is not None:
            headers.append((b"authorization", self.authorization))
        if self.content_type is not None:
            headers.append((b"content-type", self.content_type))
        if self.content_length == "correct":
            headers.append((b"content-length", str(len(self.body)).encode()))
        elif isinstance(self.content_length, bytes):
            headers.append((b"content-length", self.content_length))
        return headers + [h for h in self.extra if h[0] not in _FRAMING]

    def chunks(self) -> list[bytes]:
        points = sorted({min(c, len(self.body)) for c in self.cuts})
        edges = [0, *points, len(self.body)]
        return [self.body[a:b] for a, b in itertools.pairwise(edges)] or [b""]


_FRAMING: Final = {b"authorization", b"content-type", b"content-length", b"host"}

_LIKELY: Final = st.sampled_from([True, True, True, False])
_BODIES: Final = {
    paths.RUNTIME_DRAIN_BEGIN_PATH: drain_bodies.map(_dumps),
    paths.RUNTIME_STATE_BEGIN_PATH: handoff_bodies.map(_dumps),
    paths.RUNTIME_DRAIN_ROLLBACK_PATH: st.fixed_dictionaries({"nonce": nonces}).map(_dumps),
}


@st.composite
def examples(draw: st.DrawFn) -> Example:
    """Mostly near-valid requests (right method, token and type), so every check is reached."""
    raw_path = draw(st.sampled_from(sorted(ROUTES))) if draw(_LIKELY) else draw(raw_paths)
    route = ROUTES.get(unquote(raw_path).rstrip("/"))
    method = route[0] if route is not None and draw(_LIKELY) else draw(methods)
    authorization = draw(authorizations)
    if route is not None and route[1] != "none" and draw(_LIKELY):
        authorization = f"Bearer {TOKENS[route[1]]}".encode()
    content_type = b"application/json" if draw(_LIKELY) else draw(content_types)
    return Example(
        pre=draw(st.sampled_from(["serving", "drained"])),
        method=method,
        raw_path=raw_path,
        query=draw(query_strings),
        authorization=authorization,
        content_type=content_type,
        content_length=draw(content_lengths)
        if not draw(_LIKELY)
        else draw(st.sampled_from([None, "correct"])),
        body=draw(_BODIES.get(raw_path, raw_bodies) if draw(_LIKELY) else raw_bodies),
        cuts=draw(st.lists(st.integers(0, 60_000), max_size=3).map(tuple)),
        extra=draw(extra_headers.map(tuple)),
    )


# -- the oracle ---------------------------------------------------------------------------------


def _first(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


def _authorized(example: Example, kind: str) -> bool:
    if kind == "none":
        return True
    scheme, _, presented = (_first(example.headers(), b"authorization") or "").partition(" ")
    return scheme.lower() == "bearer" and presented == TOKENS[kind]


def _expected_framing_error(example: Example) -> tuple[int, str] | None:
    """415 or 413 a POST body must get before it is parsed, in the documented order."""
    headers = example.headers()
    content_type = _first(headers, b"content-type") or ""
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        return 415, "RUNTIME_CONTENT_TYPE"
    declared = _first(headers, b"content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY):
        return 413, "RUNTIME_BODY_TOO_LARGE"
    if len(example.body) > MAX_BODY:
        return 413, "RUNTIME_BODY_TOO_LARGE"
    return None


@dataclass(frozen=True)
class _Snapshot:
    active: bool
    draining: bool
    gate_open: bool
    pre_status: str | None
    imported: bool


def _snapshot(runtime: Runtime, state: NoteState, pre_nonce: str | None) -> _Snapshot:
    return _Snapshot(
        active=runtime.drain.active,
        draining=runtime.draining.is_set(),
        gate_open=runtime.gate.is_open,
        pre_status=None if pre_nonce is None else runtime.drain.status(pre_nonce).status,
        imported=state.imported is not None,
    )


def _check_answer(example: Example, answer: Answer) -> tuple[str | None, bool]:
    """Check ``answer`` against the design; returns (route path or None, state may change)."""
    assert answer.starts == 1
    for secret in (CONTROL_TOKEN, HANDOFF_TOKEN):
        assert secret.encode() not in answer.body
        assert all(secret.encode() not in v for v in answer.headers.values())
    path = unquote(example.raw_path)
    if not path.startswith(paths.CONTROL_PREFIX):
        # Not a control path: the user's app answers, or a drained gate refuses it.
        refused = (503, b'{"error":"RUNTIME_DRAINING"}')
        assert (answer.status, answer.body) == (
            (200, b"app") if example.pre == "serving" else refused
        )
        return None, False
    key = path.rstrip("/") or path
    if key == paths.RUNTIME_READY_PATH and answer.status == 503:
        assert answer.json() == {"ready": False, "status": "drained"}  # the drain's own state
        assert example.pre == "drained"
        return key, False
    assert answer.status < 500, (answer.status, answer.body)
    route = ROUTES.get(key)
    expected: tuple[int, str] | None = None
    if route is None:
        expected = (404, "RUNTIME_NOT_FOUND")
    else:
        method, kind, _ = route
        if example.method != method and not (method == "GET" and example.method == "HEAD"):
            expected = (405, "RUNTIME_METHOD_NOT_ALLOWED")
            assert answer.headers.get(b"allow") == (b"GET, HEAD" if method == "GET" else b"POST")
        elif not _authorized(example, kind):
            expected = (401, "RUNTIME_UNAUTHORIZED")
            assert answer.headers.get(b"www-authenticate") == b"Bearer"
        elif method == "POST":
            expected = _expected_framing_error(example)
    if answer.body == b"" and example.method == "HEAD":
        assert expected is None or answer.status == expected[0]
        return key, False
    body = answer.json()
    assert isinstance(body, dict)
    if answer.status >= 400:
        assert set(body) <= {"error", "detail"}
        assert isinstance(body["error"], str)
        assert isinstance(body.get("detail", ""), str)
    if expected is not None:
        assert (answer.status, body.get("error")) == expected, body
        return key, False
    assert route is not None
    allowed = route[2]
    if answer.status >= 400:
        assert body["error"] in allowed.get(answer.status, set()), (answer.status, body)
        return key, False
    return key, key in STATE_CHANGING


async def _one(example: Example) -> tuple[str, int]:
    state = NoteState()
    runtime, app = make_runtime(state)
    pre_nonce: str | None = None
    if example.pre == "drained":
        pre_nonce = PRE_NONCE
        runtime.drain.begin(
            {
                "protocol": "forgezero-drain/v1",
                "nonce": PRE_NONCE,
                "sourceRevision": REVISION,
                "targetRevision": OTHER_REVISION,
                "timeoutMs": 5000,
            }
        )
        assert await runtime.drain.wait() == "drained"
    before = _snapshot(runtime, state, pre_nonce)
    answer = await call(
        app,
        method=example.method,
        path=unquote(example.raw_path),
        raw_path=example.raw_path.encode("ascii"),
        query_string=example.query,
        headers=example.headers(),
        chunks=example.chunks(),
    )
    route, may_change = _check_answer(example, answer)
    after = _snapshot(runtime, state, pre_nonce)
    duplicate = may_change and answer.status == 202 and answer.json().get("duplicate") is True
    if not may_change or duplicate:
        assert after == before, (answer.status, answer.body)
    await _settle(
        runtime, example, started_handoff=may_change and route == paths.RUNTIME_STATE_BEGIN_PATH
    )
    return ("control" if route is not None else "app"), answer.status


async def _settle(runtime: Runtime, example: Example, *, started_handoff: bool) -> None:
    """Prove no handoff was started (a fresh begin is accepted as new), then clean up."""
    assert runtime.handoff is not None
    if not started_handoff:
        probe = {
            "protocol": "tests.security.note",
            "nonce": "Q" * 43,
            "schemaVersion": 1,
            "sourceRevision": REVISION,
            "targetRevision": OTHER_REVISION,
            "source": {"url": "http://127.0.0.1:9/x", "authorization": f"Bearer {HANDOFF_TOKEN}"},
        }
        assert runtime.handoff.begin(probe, 1000) == {"accepted": True, "duplicate": False}
    await runtime.aclose()
    if runtime.drain.active:
        for nonce in (PRE_NONCE, *_nonce_in(example.body)):
            try:
                runtime.drain.rollback(nonce)
            except LookupError:
                continue
            break
    await asyncio.sleep(0)


def _nonce_in(body: bytes) -> list[str]:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return []
    nonce = parsed.get("nonce") if isinstance(parsed, dict) else None
    return [nonce] if isinstance(nonce, str) else []


@pytest.mark.timeout(scale(60, 1200))
def test_fuzzed_requests_safe(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Any request to any control path: documented 4xx code, no state change, no token leak."""
    caplog.set_level(logging.DEBUG, logger="forgezero_lifecycle")
    loop = asyncio.new_event_loop()
    sent = 0
    statuses: Counter[tuple[str, int]] = Counter()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(example=examples())
    def one(example: Example) -> None:
        nonlocal sent
        sent += 1
        statuses[loop.run_until_complete(_one(example))] += 1

    try:
        one()
    finally:
        loop.close()
    report(
        "control-fuzz",
        generated_requests=sent,
        examples=EXAMPLES,
        control_statuses={s: n for (kind, s), n in sorted(statuses.items()) if kind == "control"},
        app_path_requests=sum(n for (kind, _), n in statuses.items() if kind == "app"),
        control_server_errors=sum(
            n for (kind, s), n in statuses.items() if kind == "control" and s >= 500 and s != 503
        ),
    )
    assert sent >= EXAMPLES
    assert CONTROL_TOKEN not in caplog.text
    assert HANDOFF_TOKEN not in caplog.text


# -- inputs kept out of the fuzz -----------------------------------------------------------------

BEGIN: Final = paths.RUNTIME_DRAIN_BEGIN_PATH
AUTH: Final = (b"authorization", f"Bearer {CONTROL_TOKEN}".encode())
JSON: Final = (b"content-type", b"application/json")


@pytest.mark.anyio
async def test_non_ascii_length_413() -> None:
    """A Content-Length that is not ASCII digits is refused as too large, never a 5xx."""
    _, app = make_runtime()
    answer = await call(
        app,
        method="POST",
        path=BEGIN,
        raw_path=BEGIN.encode(),
        headers=[AUTH, JSON, (b"content-length", b"\xb2")],
        chunks=[b"{}"],
    )
    assert (answer.status, answer.json()["error"]) == (413, "RUNTIME_BODY_TOO_LARGE")


@pytest.mark.anyio
async def test_non_utf8_query_4xx() -> None:
    """A query string byte that is not UTF-8 is bad input: a 4xx, not an exception."""
    _, app = make_runtime()
    status = paths.RUNTIME_DRAIN_STATUS_PATH
    answer = await call(
        app,
        method="GET",
        path=status,
        raw_path=status.encode(),
        query_string=b"nonce=\xff",
        headers=[AUTH],
    )
    assert answer.status == 404


@pytest.mark.anyio
async def test_hang_up_mid_body_no_5xx(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that disconnects before its body ends gets no 5xx and leaves no error log."""
    caplog.set_level(logging.DEBUG, logger="forgezero_lifecycle")
    runtime, app = make_runtime()
    answer = await call(
        app,
        method="POST",
        path=BEGIN,
        raw_path=BEGIN.encode(),
        headers=[AUTH, JSON, (b"content-length", b"100")],
        chunks=[b'{"nonce":', b'"x'],
        hang_up=True,
    )
    assert answer.status < 500
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not runtime.drain.active
