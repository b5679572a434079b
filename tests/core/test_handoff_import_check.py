"""The value of a handoff is validated once: by the new generation's import.

An export URL whose query says ``importCheck=importer`` is served without the old generation's
own check that the value imports as its model, which the importing side makes anyway (strict
JSON mode). Without it (a backup, an operator's look) the export is checked as before. The two
generations here are real: the old one's runtime served by uvicorn on a loopback port, drained
through its control plane, and the new one's controller fetching from it (docs/handoff.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
from pydantic import BaseModel

from forgezero_lifecycle._errors import StateExportError
from forgezero_lifecycle.client import ControlClient, drain_request
from forgezero_lifecycle.core.handoff import StateHandoffController
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.wire import paths
from forgezero_lifecycle.wire.handoff import StateImportContext
from tests.core._models import Checked, Counter

pytestmark = pytest.mark.anyio

CONTROL_TOKEN = "import-check-control-token-0123456789abcdef"
HANDOFF_TOKEN = "import-check-handoff-token-0123456789abcdef"
SOURCE = hashlib.sha1(b"the old generation").hexdigest()
TARGET = hashlib.sha1(b"the new generation").hexdigest()
NONCE = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"


@dataclasses.dataclass
class Adapter:
    value: BaseModel | None = None
    model: type[BaseModel] = Checked
    protocol: str = "test.counted"
    schema_version: int = 1
    maximum_bytes: int = 1_048_576
    imported: list[BaseModel] = dataclasses.field(default_factory=list)

    async def export_state(self) -> tuple[str, BaseModel]:
        assert self.value is not None
        return "cursor-1", self.value

    async def import_state(self, value: BaseModel, context: StateImportContext) -> None:
        self.imported.append(value)


@contextlib.asynccontextmanager
async def drained_old_generation(adapter: Adapter) -> AsyncIterator[str]:
    """The old generation's runtime served by uvicorn on loopback, drained (an export needs
    closed intake); yields its base URL."""
    runtime = Runtime(
        control_token=CONTROL_TOKEN,
        handoff_token=HANDOFF_TOKEN,
        revision=SOURCE,
        state_adapter=adapter,
    )
    config = uvicorn.Config(
        runtime.wrap(runtime.control), lifespan="off", log_level="warning", http="h11"
    )
    server = uvicorn.Server(config)
    listener = socket.create_server(("127.0.0.1", 0))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        for _ in range(1500):  # uvicorn says it serves with a plain attribute: looked at
            if server.started:
                break
            await asyncio.sleep(0.01)
        async with ControlClient(url, token=CONTROL_TOKEN) as control:
            drain = drain_request(source_revision=SOURCE, target_revision=TARGET, timeout_ms=30_000)
            await control.begin_drain(drain)
        yield url
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 15)
        listener.close()


def export_url(base: str, *, importer_checks: bool) -> str:
    query = f"?sourceRevision={SOURCE}&targetRevision={TARGET}"
    if importer_checks:
        query += f"&{paths.IMPORT_CHECK_QUERY}={paths.IMPORTER_CHECKS}"
    return base + paths.RUNTIME_STATE_EXPORT_PATH + query


async def hand_over(url: str, model: type[BaseModel]) -> tuple[Any, Adapter]:
    """The new generation fetches ``url`` and imports it; its status, and its adapter."""
    adapter = Adapter(model=model, protocol="test.counted")
    controller = StateHandoffController(adapter)
    request = {
        "protocol": "test.counted",
        "nonce": NONCE,
        "schemaVersion": 1,
        "sourceRevision": SOURCE,
        "targetRevision": TARGET,
        "source": {"url": url, "authorization": f"Bearer {HANDOFF_TOKEN}"},
    }
    controller.begin(request, 10_000)
    try:
        return await controller.wait(NONCE), adapter
    finally:
        await controller.aclose()


@pytest.mark.parametrize("importer_checks", [True, False])
async def test_value_validated_once_when_the_importer_checks(importer_checks: bool) -> None:
    """With importCheck=importer the value is validated once, by the import; without, the
    export checks it too: twice in all."""
    old = Adapter(value=Checked(count=7))
    async with drained_old_generation(old) as base:
        Checked.validations.clear()
        status, new = await hand_over(export_url(base, importer_checks=importer_checks), Checked)
    validations = list(Checked.validations)
    assert status.status == "acknowledged"
    assert [value.model_dump() for value in new.imported] == [{"count": 7}]
    assert validations == ([7] if importer_checks else [7, 7])


async def test_unimportable_value_fails_at_the_import() -> None:
    """A value whose JSON its model refuses is not imported either way: refused by the export
    when it checks, by the new generation when the importer checks (with the model's reason)."""
    old = Adapter(value=Counter(count=7), model=Counter)
    async with drained_old_generation(old) as base:
        unchecked, new = await hand_over(export_url(base, importer_checks=True), Counter)
        assert unchecked.status == "failed"
        assert unchecked.failure == "RUNTIME_STATE_ENVELOPE_INVALID"
        assert new.imported == []
        async with httpx.AsyncClient(trust_env=False) as client:
            auth = {"authorization": f"Bearer {HANDOFF_TOKEN}"}
            checked = await client.get(export_url(base, importer_checks=False), headers=auth)
            served = await client.get(export_url(base, importer_checks=True), headers=auth)
    assert checked.status_code == 422
    assert checked.json()["error"] == "RUNTIME_STATE_EXPORT_INVALID"
    assert served.status_code == 200
    assert served.json()["value"] == {"count": "7"}


async def test_other_values_of_the_parameter_check() -> None:
    """Only ``importer`` leaves the check to the import: any other value is checked."""
    old = Adapter(value=Counter(count=7), model=Counter)
    async with drained_old_generation(old) as base:
        url = export_url(base, importer_checks=False) + f"&{paths.IMPORT_CHECK_QUERY}=exporter"
        async with httpx.AsyncClient(trust_env=False) as client:
            answer = await client.get(url, headers={"authorization": f"Bearer {HANDOFF_TOKEN}"})
    assert answer.status_code == 422
    assert answer.json()["error"] == "RUNTIME_STATE_EXPORT_INVALID"


async def test_export_document_leaves_the_check_to_the_importer() -> None:
    """``export_document(check_imports=False)`` serves a value its model would refuse; the
    default refuses it (``RUNTIME_STATE_EXPORT_INVALID``)."""
    controller = StateHandoffController(Adapter(value=Counter(count=7), model=Counter))
    document = await controller.export_document(SOURCE, TARGET, check_imports=False)
    assert json.loads(document)["value"] == {"count": "7"}
    with pytest.raises(StateExportError, match="RUNTIME_STATE_EXPORT_INVALID"):
        await controller.export_document(SOURCE, TARGET)
    await controller.aclose()
