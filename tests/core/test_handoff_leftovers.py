"""What sealing and opening a state leave behind is freed, and nothing stays.

With the collector setting on (``handoff_pauses_collector``), the export's dumped value and the
import check's typed value are freed once the export's last byte is sent, and are past the
collector's young generation meanwhile, so no young collection scans them; with it off (the
default) they are freed inside the sealing step. The new generation's parsed envelope is freed
before its value is validated. The tests touch the process's collector on purpose
(tests/core/_collector.py says what they read).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import threading
import weakref
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import httpx
import pytest
from pydantic import BaseModel, model_validator

from forgezero_lifecycle._errors import ConfigurationError, StateExportError
from forgezero_lifecycle.asgi._types import Message
from forgezero_lifecycle.core._codec import Leftovers, StateCodec
from forgezero_lifecycle.core.handoff import StateHandoffController
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.wire import paths
from forgezero_lifecycle.wire.handoff import StateHandoffRequest, StateImportContext
from tests.core._collector import in_young_generation, nothing_frozen

pytestmark = pytest.mark.anyio

SRC = "0123456789abcdef0123456789abcdef01234567"
TGT = "fedcba9876543210fedcba9876543210fedcba98"
NONCE = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
AUTHORIZATION = "Bearer dG9rZW4tZm9yLWZvcmdlemVyby1vcmFjbGUtdGVzdHM"
CONTROL_TOKEN = "leftovers-control-token-0123456789"
HANDOFF_TOKEN = "leftovers-handoff-token-0123456789abcdefghi"
#: The cursor of every export here: how a parsed envelope is recognised among live objects.
CURSOR = "leftovers-cursor-1"


class Table(BaseModel):
    """A value that records a weak reference to every instance validation builds."""

    rows: list[str]
    built: ClassVar[list[weakref.ref[Table]]] = []
    #: How many parsed envelopes were alive at each validation.
    envelopes_seen: ClassVar[list[int]] = []

    @model_validator(mode="after")
    def _recorded(self) -> Table:
        Table.built.append(weakref.ref(self))
        Table.envelopes_seen.append(parsed_envelopes())
        return self


@dataclasses.dataclass
class Adapter:
    value: Table | None = None
    protocol: str = "demo.table"
    schema_version: int = 1
    maximum_bytes: int = 1_048_576
    model: type[Table] = Table
    imported: list[Table] = dataclasses.field(default_factory=list)

    async def export_state(self) -> tuple[str, Table]:
        assert self.value is not None
        return CURSOR, self.value

    async def import_state(self, value: Table, context: StateImportContext) -> None:
        self.imported.append(value)


def table(note: str = "") -> Table:
    value = Table(rows=[f"row-{i}{note}" for i in range(500)])
    Table.built.clear()  # from here on, only what the codec validates is recorded
    return value


def checked() -> list[Table]:
    """The typed values the import check built that are still alive."""
    return [value for ref in Table.built if (value := ref()) is not None]


def parsed_envelopes() -> int:
    """How many parsed envelopes (dicts with this module's cursor and a value) are alive."""
    return sum(
        1
        for item in gc.get_objects()
        if type(item) is dict and item.get("cursor") == CURSOR and "value" in item
    )


# -- the codec -----------------------------------------------------------------------------------


@pytest.mark.usefixtures("collector_enabled")
def test_seal_frees_by_default() -> None:
    """Without the collector setting, a holder stays empty: young, the leftovers would be
    scanned by every collection until dropped, so the step frees them itself."""
    leftovers = Leftovers()
    StateCodec.of(Adapter()).seal_document(CURSOR, table(), SRC, TGT, leftovers=leftovers)
    assert len(Table.built) == 1
    assert checked() == []
    assert len(leftovers) == 0


@pytest.mark.usefixtures("collector_enabled")
def test_seal_leaves_value_held() -> None:
    """With the collector setting, sealing leaves the check's typed value (and the dumped value)
    in a holder, past the young generation, until it is dropped; dropping frees it."""
    codec = StateCodec.of(Adapter(), pause_collector=True)
    leftovers = Leftovers()
    nothing_frozen()
    codec.seal_document(CURSOR, table(), SRC, TGT, leftovers=leftovers)
    [value] = checked()
    assert len(leftovers) == 2
    assert not in_young_generation(value)
    del value
    leftovers.drop()
    assert len(leftovers) == 0
    assert checked() == []


def test_no_holder_value_dies() -> None:
    """No holder: the check's typed value is freed before sealing returns."""
    StateCodec.of(Adapter()).seal_document(CURSOR, table(), SRC, TGT)
    assert len(Table.built) == 1
    assert checked() == []


@pytest.mark.usefixtures("collector_enabled")
def test_too_large_holds_nothing() -> None:
    """A seal that fails (the state is over its limit) keeps nothing for later: what it made
    dies with the step, as without a holder."""
    codec = StateCodec.of(Adapter(maximum_bytes=1_024), pause_collector=True)
    leftovers = Leftovers()
    with pytest.raises(StateExportError) as refused:
        codec.seal_document(CURSOR, table(), SRC, TGT, leftovers=leftovers)
    assert refused.value.code == "RUNTIME_STATE_EXPORT_TOO_LARGE"
    assert len(leftovers) == 0
    # The traceback keeps the failed step's frames (their dicts look like parsed envelopes to
    # the later tests' census) in a cycle with this frame: break it now.
    del refused
    gc.collect()


@pytest.mark.usefixtures("collector_enabled")
def test_frozen_app_frees_inline() -> None:
    """Where the held objects could not skip the young collections (the app froze objects
    itself), sealing frees them inline and the holder stays empty."""
    codec = StateCodec.of(Adapter(), pause_collector=True)
    leftovers = Leftovers()
    gc.freeze()
    try:
        codec.seal_document(CURSOR, table(), SRC, TGT, leftovers=leftovers)
    finally:
        gc.unfreeze()
    assert checked() == []
    assert len(leftovers) == 0


def test_holding_again_frees_first() -> None:
    """The holder is one-shot: a second step's leftovers replace the first's, which are freed."""
    codec = StateCodec.of(Adapter(), pause_collector=True)
    leftovers = Leftovers()
    nothing_frozen()
    codec.seal_document(CURSOR, table("a"), SRC, TGT, leftovers=leftovers)
    codec.seal_document(CURSOR, table("b"), SRC, TGT, leftovers=leftovers)
    assert len(checked()) == 1
    assert len(leftovers) == 2


# -- the old generation: after the export's last byte ----------------------------------------------


async def test_export_holds_until_release() -> None:
    """export_document returns with the check's typed value still held; release_export frees
    it, and so do the next export and aclose."""
    adapter = Adapter(value=table())
    controller = StateHandoffController(adapter, pause_collector=True)
    nothing_frozen()
    await controller.export_document(SRC, TGT)
    assert len(checked()) == 1
    controller.release_export()
    assert checked() == []

    adapter.value = table("next")
    await controller.export_document(SRC, TGT)
    first = checked()
    adapter.value = table("again")
    await controller.export_document(SRC, TGT)
    assert [ref() for ref in Table.built] == checked()  # only the last export's check is alive
    assert first[0] is not checked()[0]
    del first
    await controller.aclose()
    assert checked() == []


async def test_endpoint_frees_after_body() -> None:
    """Through the control plane: the check's typed value is alive while the body is sent,
    and freed once the response is complete, on the event loop (not in a worker thread)."""
    runtime = Runtime(
        control_token=CONTROL_TOKEN,
        handoff_token=HANDOFF_TOKEN,
        state_adapter=Adapter(table()),
        handoff_pauses_collector=True,
    )
    nothing_frozen()
    transport = httpx.ASGITransport(app=runtime.control)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        begin = {
            "protocol": "forgezero-drain/v1",
            "nonce": "N" * 43,
            "sourceRevision": SRC,
            "targetRevision": TGT,
            "timeoutMs": 5000,
        }
        drain = await http.post(
            paths.RUNTIME_DRAIN_BEGIN_PATH,
            json=begin,
            headers={"authorization": f"Bearer {CONTROL_TOKEN}"},
        )
        assert drain.status_code == 202
    alive_at: dict[str, int] = {}
    freed_in: list[int] = []
    watch: list[weakref.ref[Table]] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        alive = checked()
        alive_at[message["type"]] = len(alive)
        watch.extend(
            weakref.ref(value, lambda _: freed_in.append(threading.get_ident())) for value in alive
        )

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": paths.RUNTIME_STATE_EXPORT_PATH,
        "raw_path": paths.RUNTIME_STATE_EXPORT_PATH.encode(),
        "query_string": f"sourceRevision={SRC}&targetRevision={TGT}".encode(),
        "root_path": "",
        "headers": [(b"authorization", f"Bearer {HANDOFF_TOKEN}".encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    await runtime.control(scope, receive, send)
    assert alive_at == {"http.response.start": 1, "http.response.body": 1}
    assert checked() == []
    assert set(freed_in) == {threading.get_ident()}  # on the event loop's thread
    await runtime.aclose()


async def test_default_export_keeps_none() -> None:
    """Without the collector setting, export_document returns with nothing of the step's
    alive: there is nothing for release_export to free."""
    controller = StateHandoffController(Adapter(value=table()))
    await controller.export_document(SRC, TGT)
    assert len(Table.built) == 1
    assert checked() == []
    await controller.aclose()


def test_collector_setting_is_bool() -> None:
    """Anything but True or False is refused when the runtime is built."""
    with pytest.raises(ConfigurationError) as refused:
        Runtime(
            control_token=CONTROL_TOKEN,
            state_adapter=Adapter(),
            # Wrong on purpose: construction must refuse a non-bool.
            handoff_pauses_collector="yes",  # type: ignore[arg-type]
        )
    assert refused.value.code == "RUNTIME_CONFIG_INVALID"
    assert "handoff_pauses_collector" in str(refused.value)


# -- the new generation: before the validation ------------------------------------------------


def import_request(port: int) -> dict[str, Any]:
    return {
        "protocol": "demo.table",
        "nonce": NONCE,
        "schemaVersion": 1,
        "sourceRevision": SRC,
        "targetRevision": TGT,
        "source": {"url": f"http://127.0.0.1:{port}/export", "authorization": AUTHORIZATION},
    }


@contextlib.asynccontextmanager
async def serving(document: bytes) -> AsyncIterator[int]:
    """A loopback HTTP source answering every request with ``document``."""
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(document)}\r\nConnection: close\r\n\r\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(head.encode() + document)
        await writer.drain()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


def test_open_body_frees_envelope() -> None:
    """Once its canonical JSON is made, the parsed envelope is freed: the typed value is built
    in the memory it leaves, and none of it outlives the step."""
    _, document = StateCodec.of(Adapter()).seal_document(CURSOR, table(), SRC, TGT)
    Table.envelopes_seen.clear()
    request = StateHandoffRequest.model_validate(import_request(1))
    value, _ = StateCodec.of(Adapter()).open_body(request, document)
    assert Table.envelopes_seen == [0]
    assert parsed_envelopes() == 0
    assert value.rows[-1] == "row-499"


def test_open_keeps_callers_envelope() -> None:
    """open() of an envelope the caller parsed validates it without emptying it."""
    _, document = StateCodec.of(Adapter()).seal_document(CURSOR, table(), SRC, TGT)
    envelope = json.loads(document)
    request = StateHandoffRequest.model_validate(import_request(1))
    value, _ = StateCodec.of(Adapter()).open(request, envelope)
    assert envelope == json.loads(document)
    assert value.rows == envelope["value"]["rows"]


async def test_handoff_keeps_no_envelope() -> None:
    """Over a real socket: the value is validated with no parsed envelope alive, and the
    acknowledged handoff keeps none."""
    exporter = StateHandoffController(Adapter(value=table()))
    document = await exporter.export_document(SRC, TGT)
    await exporter.aclose()
    adapter = Adapter()
    importer = StateHandoffController(adapter)
    Table.envelopes_seen.clear()
    async with serving(document) as port:
        importer.begin(import_request(port), 10_000)
        status = await importer.wait(NONCE)
    assert status.status == "acknowledged"
    assert Table.envelopes_seen == [0]
    assert parsed_envelopes() == 0
    assert adapter.imported[0].rows[-1] == "row-499"
    await importer.aclose()


async def test_failed_handoff_keeps_none() -> None:
    """A handoff that fails after the envelope was read (a digest mismatch) keeps none of it."""
    exporter = StateHandoffController(Adapter(value=table()))
    document = await exporter.export_document(SRC, TGT)
    await exporter.aclose()
    tampered = document.replace(b'"row-499"', b'"row-498"')
    importer = StateHandoffController(Adapter())
    async with serving(tampered) as port:
        importer.begin(import_request(port), 10_000)
        status = await importer.wait(NONCE)
    assert status.failure == "RUNTIME_STATE_DIGEST_MISMATCH"
    assert parsed_envelopes() == 0
    await importer.aclose()
