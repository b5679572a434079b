"""StateHandoffController beyond the vectors: typed models over real loopback sockets."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import subprocess
import sys
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import httpx
import pytest
from pydantic import (
    BaseModel,
    Field,
    Secret,
    SecretBytes,
    SecretStr,
)

from forgezero_lifecycle._canonical import canonical_json, state_digest
from forgezero_lifecycle._errors import StateExportError, StateInputInvalidError, StateNotFoundError
from forgezero_lifecycle.core._state_value import failure_text
from forgezero_lifecycle.core.handoff import StateHandoffController
from forgezero_lifecycle.testing import ManualClock, settle
from forgezero_lifecycle.wire.handoff import (
    SOURCE_SLACK_BYTES,
    StateHandoffRequest,
    StateImportContext,
)
from tests.core._models import Checked, Counter

pytestmark = pytest.mark.anyio

NONCE = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
SRC = "0123456789abcdef0123456789abcdef01234567"
TGT = "fedcba9876543210fedcba9876543210fedcba98"
AUTHORIZATION = "Bearer dG9rZW4tZm9yLWZvcmdlemVyby1vcmFjbGUtdGVzdHM"


class Cart(BaseModel):
    owner: str
    items: tuple[str, ...]
    counts: dict[str, int]
    updated: datetime
    ratio: float


@dataclasses.dataclass
class Adapter:
    """A typed adapter: ``value`` is exported, imports are recorded."""

    value: BaseModel | None = None
    model: type[BaseModel] = Cart
    protocol: str = "demo.cart"
    schema_version: int = 1
    maximum_bytes: int = 1_048_576
    imported: list[tuple[BaseModel, StateImportContext]] = dataclasses.field(default_factory=list)

    async def export_state(self) -> tuple[str, BaseModel]:
        assert self.value is not None
        return "cursor-1", self.value

    async def import_state(self, value: BaseModel, context: StateImportContext) -> None:
        self.imported.append((value, context))


def cart(note: str = "") -> Cart:
    return Cart(
        owner="ada" + note,
        items=("apple", "é😀"),
        counts={"apple": 2, "\ue000": 1},
        updated=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        ratio=0.1,
    )


def request(port: int, path: str = "/export") -> dict[str, Any]:
    return {
        "protocol": "demo.cart",
        "nonce": NONCE,
        "schemaVersion": 1,
        "sourceRevision": SRC,
        "targetRevision": TGT,
        "source": {"url": f"http://127.0.0.1:{port}{path}", "authorization": AUTHORIZATION},
    }


def http(body: bytes, status: str = "200 OK", headers: str = "") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{headers}Connection: close\r\n\r\n"
    return head.encode() + body


class Targets(list[str]):
    """The request targets a source saw; ``asked`` is set by the first."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()


@contextlib.asynccontextmanager
async def source(answer: Callable[[str], bytes | None]) -> AsyncIterator[tuple[int, Targets]]:
    """A loopback HTTP source: ``answer(target)`` gives the raw response, None never answers."""
    targets = Targets()
    release = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            targets.append(head.split(b" ")[1].decode())
            targets.asked.set()
            response = answer(targets[-1])
            if response is None:
                await release.wait()
            else:
                writer.write(response)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], targets
    finally:
        release.set()
        server.close()
        await server.wait_closed()
        await settle()


async def handoff(controller: StateHandoffController[Any], port: int, path: str = "/export") -> Any:
    assert controller.begin(request(port, path), 30_000) == {"accepted": True, "duplicate": False}
    return await asyncio.wait_for(controller.wait(NONCE), 20)


# -- the adapter is non-secret by design -------------------------------------------------------


class Inner(BaseModel):
    token: SecretStr


@dataclasses.dataclass
class Holder:
    keys: list[SecretBytes]


class WithInner(BaseModel):
    inner: Inner | None = None


class WithDataclass(BaseModel):
    holder: Holder


class WithGenericSecret(BaseModel):
    pin: dict[str, Secret[int]]


@pytest.mark.parametrize("model", [Inner, WithInner, WithDataclass, WithGenericSecret])
def test_secret_field_refused(model: type[BaseModel]) -> None:
    """A SecretStr/SecretBytes/Secret field at any depth refuses the adapter at construction."""
    with pytest.raises(StateInputInvalidError) as caught:
        StateHandoffController(Adapter(model=model))
    assert caught.value.code == "RUNTIME_STATE_ADAPTER_INVALID"
    assert "secret" in str(caught.value)


def test_adapter_limits_checked() -> None:
    """maximum_bytes above 1 MiB and a model that is not pydantic are refused."""
    for adapter in (
        Adapter(maximum_bytes=1_048_577),
        Adapter(model=dict),
    ):  # deliberately the wrong type: the test is about refusing it
        with pytest.raises(StateInputInvalidError, match="RUNTIME_STATE_ADAPTER_INVALID"):
            StateHandoffController(adapter)


# -- export, then import over a real socket ----------------------------------------------------


async def test_loopback_round_trip() -> None:
    """A typed value exported by one generation is imported, equal, by the next, exactly once."""
    exporter = StateHandoffController(Adapter(value=cart()))
    envelope = await exporter.export_state(SRC, TGT)
    body = json.dumps(envelope.model_dump(mode="json")).encode()
    importer_adapter = Adapter()
    async with source(lambda target: http(body)) as (port, targets):
        status = await handoff(StateHandoffController(importer_adapter), port)
    assert status.status == "acknowledged"
    assert status.model_dump(mode="json", exclude_none=True)["digest"] == envelope.digest
    assert targets == ["/export"]
    [(value, context)] = importer_adapter.imported
    assert value == cart()
    assert context == StateImportContext(
        source_revision=SRC, target_revision=TGT, cursor="cursor-1", digest=envelope.digest
    )
    unsigned = envelope.model_dump(mode="json", exclude={"digest"}, by_alias=True)
    assert envelope.digest == state_digest(unsigned)


async def test_import_never_coerces() -> None:
    """The value is validated strictly as JSON: "2" is not an int, even if lax pydantic takes it."""
    envelope = await StateHandoffController(Adapter(value=cart())).export_state(SRC, TGT)
    data = envelope.model_dump(mode="json")
    data["value"]["counts"]["apple"] = "2"
    data["digest"] = state_digest({k: v for k, v in data.items() if k != "digest"})
    adapter = Adapter()
    async with source(lambda target: http(json.dumps(data).encode())) as (port, _):
        status = await handoff(StateHandoffController(adapter), port)
    assert (status.status, status.failure) == ("failed", "RUNTIME_STATE_ENVELOPE_INVALID")
    assert adapter.imported == []


async def test_state_at_limit_imports() -> None:
    """Size symmetry: canonical size == maximum_bytes exports, and imports even pretty-printed."""
    probe = Adapter(value=cart(), maximum_bytes=1_048_576)
    envelope = await StateHandoffController(probe).export_state(SRC, TGT)
    unsigned = envelope.model_dump(mode="json", exclude={"digest"})
    limit = len(canonical_json(unsigned)) + 500
    at_limit = Adapter(value=cart("x" * 500), maximum_bytes=limit)
    envelope = await StateHandoffController(at_limit).export_state(SRC, TGT)
    assert len(canonical_json(envelope.model_dump(mode="json", exclude={"digest"}))) == limit
    over = Adapter(value=cart("x" * 501), maximum_bytes=limit)
    with pytest.raises(StateExportError, match="RUNTIME_STATE_EXPORT_TOO_LARGE"):
        await StateHandoffController(over).export_state(SRC, TGT)

    body = json.dumps(envelope.model_dump(mode="json"), indent=2).encode()
    assert limit < len(body) <= limit + SOURCE_SLACK_BYTES
    importer = Adapter(maximum_bytes=limit)
    async with source(lambda target: http(body)) as (port, _):
        status = await handoff(StateHandoffController(importer), port)
    assert status.status == "acknowledged"
    assert importer.imported[0][0] == at_limit.value


async def test_export_refuses_unimportable() -> None:
    """An exported value whose JSON does not validate as its own model is EXPORT_INVALID."""
    adapter = Adapter(value=Counter(count=7), model=Counter)
    with pytest.raises(StateExportError, match="RUNTIME_STATE_EXPORT_INVALID"):
        await StateHandoffController(adapter).export_state(SRC, TGT)


async def test_import_check_runs_once() -> None:
    """Exporting the same value's JSON again does not validate it again: those exact bytes
    already validated as the model. Another value's JSON is validated before it is served."""
    value = Checked(count=7)
    Checked.validations.clear()
    controller = StateHandoffController(Adapter(value=value, model=Checked))
    first = await controller.export_document(SRC, TGT)
    assert Checked.validations == [7]
    assert await controller.export_document(SRC, TGT) == first
    await controller.export_state(SRC, "0" * 40)
    assert Checked.validations == [7]
    value.count = 8
    await controller.export_document(SRC, TGT)
    assert Checked.validations == [7, 8]


async def test_changed_value_rechecked() -> None:
    """A value that exported, then changed (unvalidated assignment) into JSON its model
    refuses, is EXPORT_INVALID: the check is skipped only for bytes that passed it."""
    value = Counted(count=7)
    controller = StateHandoffController(Adapter(value=value, model=Counted))
    await controller.export_document(SRC, TGT)
    value.count = -1  # the model accepts only count >= 0; assignment is not validated
    with pytest.raises(StateExportError, match="RUNTIME_STATE_EXPORT_INVALID"):
        await controller.export_document(SRC, TGT)
    with pytest.raises(StateExportError, match="RUNTIME_STATE_EXPORT_INVALID"):
        await controller.export_state(SRC, TGT)


class Counted(BaseModel):
    count: Annotated[int, Field(ge=0)]


async def test_served_document_canonical() -> None:
    """export_document gives exactly canonical_json(envelope), and its digest verifies."""
    from forgezero_lifecycle._canonical import canonical_json, state_digest

    controller = StateHandoffController(Adapter(value=cart("ünïcode ✓")))
    envelope = await controller.export_state(SRC, TGT)
    document = await controller.export_document(SRC, TGT)
    assert document == canonical_json(envelope.model_dump())
    unsigned = {k: v for k, v in json.loads(document).items() if k != "digest"}
    assert state_digest(unsigned) == envelope.digest


# -- the fetch: redirects, bombs, deadlines ------------------------------------------------------


async def test_redirect_is_never_followed() -> None:
    """A 302 to a path serving a valid envelope fails HTTP_302; the source sees one request."""
    envelope = await StateHandoffController(Adapter(value=cart())).export_state(SRC, TGT)
    body = json.dumps(envelope.model_dump(mode="json")).encode()

    def answer(target: str) -> bytes:
        if target == "/next":
            return http(body)
        return http(b"", "302 Found", "Location: /next\r\n")

    adapter = Adapter()
    async with source(answer) as (port, targets):
        status = await handoff(StateHandoffController(adapter), port)
    assert (status.status, status.failure) == ("failed", "RUNTIME_STATE_SOURCE_HTTP_302")
    assert targets == ["/export"]
    assert adapter.imported == []


class CountingTransport(httpx.AsyncBaseTransport):
    """The real transport, counting the raw (still encoded) body bytes handed to the reader."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.raw_bytes = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        outer = self

        class Counted(httpx.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                async for chunk in stream:
                    outer.raw_bytes += len(chunk)
                    yield chunk

            async def aclose(self) -> None:
                await stream.aclose()

        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=Counted(),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


def gzip_of_zeros(size: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1 << 20)
    return b"".join(compressor.compress(block) for _ in range(size >> 20)) + compressor.flush()


async def test_gzip_bomb_is_bounded() -> None:
    """256 MiB of gzip-encoded zeros stop at the limit: little read, little memory, TOO_LARGE."""
    bomb = gzip_of_zeros(256 << 20)
    transport = CountingTransport()
    adapter = Adapter(maximum_bytes=1 << 20)
    async with source(lambda target: http(bomb, headers="Content-Encoding: gzip\r\n")) as (
        port,
        targets,
    ):
        tracemalloc.start()
        try:
            status = await handoff(StateHandoffController(adapter, transport=transport), port)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert (status.status, status.failure) == ("failed", "RUNTIME_STATE_SOURCE_TOO_LARGE")
    assert targets == ["/export"]
    assert transport.raw_bytes < len(bomb) // 2
    assert peak < 8 << 20, f"decoding peaked at {peak} bytes"


@pytest.mark.parametrize(
    ("response", "failure"),
    [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 4197\r\nConnection: close\r\n\r\n{}",
            "SOURCE_TOO_LARGE",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{}",
            "SOURCE_UNREACHABLE",
        ),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{}", "SOURCE_UNREACHABLE"),
        (b"SMTP ready\r\n\r\n", "SOURCE_UNREACHABLE"),
        (b"", "SOURCE_UNREACHABLE"),
        (http(b"x" * 4197), "SOURCE_TOO_LARGE"),
        (http(b"{}", headers="Content-Encoding: gzip\r\n"), "ENVELOPE_INVALID"),
    ],
)
async def test_source_failures_are_codes(response: bytes, failure: str) -> None:
    """D5/D7/D8: oversize (announced or read), truncated and garbled answers end as codes."""
    adapter = Adapter(maximum_bytes=100)
    async with source(lambda target: response) as (port, targets):
        status = await handoff(StateHandoffController(adapter), port)
    assert (status.status, status.failure) == ("failed", f"RUNTIME_STATE_{failure}")
    assert targets == ["/export"]
    assert adapter.imported == []


async def test_refused_is_unreachable() -> None:
    """Nothing listening on the port: SOURCE_UNREACHABLE, and nothing imported."""
    async with source(lambda target: None) as (port, _):
        pass
    status = await handoff(StateHandoffController(Adapter()), port)
    assert (status.status, status.failure) == ("failed", "RUNTIME_STATE_SOURCE_UNREACHABLE")


async def test_deadline_on_injected_clock() -> None:
    """A source that never answers fails TIMEOUT when the clock passes timeoutMs."""
    clock = ManualClock()
    adapter = Adapter()
    async with source(lambda target: None) as (port, targets):
        controller = StateHandoffController(adapter, clock=clock)
        controller.begin(request(port), 1_000)
        await asyncio.wait_for(targets.asked.wait(), 10)
        await clock.advance(0.999)
        assert controller.status(NONCE).status == "pending"
        await clock.advance(0.001)
        status = await asyncio.wait_for(controller.wait(NONCE), 10)
    assert (status.status, status.failure) == ("failed", "RUNTIME_STATE_TIMEOUT")
    assert targets == ["/export"]


async def test_duplicate_after_ack_no_fetch() -> None:
    """An exact retry is a duplicate even once settled; the value is imported exactly once."""
    envelope = await StateHandoffController(Adapter(value=cart())).export_state(SRC, TGT)
    body = json.dumps(envelope.model_dump(mode="json")).encode()
    adapter = Adapter()
    async with source(lambda target: http(body)) as (port, targets):
        controller = StateHandoffController(adapter)
        await handoff(controller, port)
        retry = StateHandoffRequest.model_validate(request(port))
        assert controller.begin(retry, 30_000) == {"accepted": True, "duplicate": True}
        await settle()
    assert targets == ["/export"]
    assert len(adapter.imported) == 1


async def test_aclose_cancels_fetch() -> None:
    """Closing the controller ends a fetch still in flight as failed, not pending forever."""
    async with source(lambda target: None) as (port, targets):
        controller = StateHandoffController(Adapter())
        controller.begin(request(port), 30_000)
        await asyncio.wait_for(targets.asked.wait(), 10)
        await controller.aclose()
        assert controller.status(NONCE).failure == "RUNTIME_STATE_FAILED"
    with pytest.raises(StateNotFoundError):
        controller.status(NONCE[::-1])


def test_token_not_in_repr() -> None:
    """A logged request does not leak the bearer token."""
    parsed = StateHandoffRequest.model_validate(request(1))
    assert AUTHORIZATION.split()[1] not in repr(parsed)


def test_failure_text_code_points() -> None:
    """D9: 128 code points; a surrogate pair held as two code units is one and never split."""
    assert failure_text("y" * 127 + "😀 and more") == "y" * 127 + "😀"
    assert failure_text("y" * 127 + "\ud83d\ude00 and more") == "y" * 127 + "\ud83d\ude00"
    assert failure_text("short") == "short"


@pytest.mark.parametrize(
    "maximum_bytes",
    [2**20 + 1, 1 << 20_000, 0, -1, 1.5, True, "1024"],
    ids=["over-1MiB", "20000-bit-int", "zero", "negative", "fraction", "bool", "string"],
)
def test_bad_size_limit_refused(
    maximum_bytes: object,
) -> None:
    """Any bad maximum_bytes, however large, is RUNTIME_STATE_ADAPTER_INVALID, never a crash."""
    from forgezero_lifecycle._errors import StateInputInvalidError
    from forgezero_lifecycle.core.handoff import StateHandoffController

    class Value(BaseModel):
        n: int

    class Adapter:
        protocol = "test.limits"
        schema_version = 1
        model = Value

        async def export_state(self) -> tuple[str, Value]:
            return "c", Value(n=1)

        async def import_state(self, value: Value, context: object) -> None:
            return None

    adapter = Adapter()
    adapter.maximum_bytes = maximum_bytes
    with pytest.raises(StateInputInvalidError) as caught:
        StateHandoffController(
            adapter
        )  # deliberately the wrong type: the test is about refusing it
    assert caught.value.code == "RUNTIME_STATE_ADAPTER_INVALID"


async def test_lazy_fetch_built_on_begin() -> None:
    """``prepare_fetch=False`` defers the transport to ``begin``; the handoff still completes."""
    envelope = await StateHandoffController(Adapter(value=cart())).export_state(SRC, TGT)
    body = json.dumps(envelope.model_dump(mode="json")).encode()
    importer_adapter = Adapter()
    importer = StateHandoffController(importer_adapter, prepare_fetch=False)
    async with source(lambda target: http(body)) as (port, _):
        status = await handoff(importer, port)
    assert status.status == "acknowledged"
    assert [value for value, _ in importer_adapter.imported] == [cart()]


_UNPREPARED = """
import sys
from pydantic import BaseModel
from forgezero_lifecycle.core.handoff import StateHandoffController

class Visits(BaseModel):
    count: int

class Adapter:
    protocol, schema_version, maximum_bytes, model = "demo.visits", 1, 1024, Visits

StateHandoffController(Adapter(), prepare_fetch=False)
print("httpx" in sys.modules)
StateHandoffController(Adapter())
print("httpx" in sys.modules)
"""


def test_unprepared_no_httpx_import() -> None:
    """httpx is loaded by the first controller that prepares its fetch, not before."""
    done = subprocess.run(
        [sys.executable, "-c", _UNPREPARED], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
