"""State export is tied to the runtime's revision, as drain begin is."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.wire import paths
from tests.security._asgi import CONTROL_TOKEN, HANDOFF_TOKEN, REVISION, NoteState, make_runtime

pytestmark = pytest.mark.anyio

OTHER = hashlib.sha1(b"another generation").hexdigest()
TARGET = hashlib.sha1(b"the next generation").hexdigest()


async def export(runtime: Runtime, source_revision: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=runtime.wrap(runtime.control))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        begin = {
            "protocol": "forgezero-drain/v1",
            "nonce": "N" * 43,
            "sourceRevision": runtime.revision or source_revision,
            "targetRevision": TARGET,
            "timeoutMs": 5000,
        }
        control = {"authorization": f"Bearer {CONTROL_TOKEN}"}
        assert (
            await http.post(paths.RUNTIME_DRAIN_BEGIN_PATH, json=begin, headers=control)
        ).is_success
        return await http.get(
            paths.RUNTIME_STATE_EXPORT_PATH,
            params={"sourceRevision": source_revision, "targetRevision": TARGET},
            headers={"authorization": f"Bearer {HANDOFF_TOKEN}"},
        )


async def test_other_revision_409() -> None:
    """A runtime that knows its revision refuses to export as another one, exporting nothing."""
    note = NoteState()
    runtime, _ = make_runtime(note)
    response = await export(runtime, OTHER)
    assert response.status_code == 409
    assert response.json()["error"] == "RUNTIME_STATE_REVISION_MISMATCH"
    assert note.exports == 0


async def test_own_revision_served() -> None:
    """The matching revision exports as before."""
    runtime, _ = make_runtime()
    response = await export(runtime, REVISION)
    assert response.status_code == 200
    assert response.json()["sourceRevision"] == REVISION


async def test_no_revision_exports_any() -> None:
    """No configured revision: nothing to compare, as drain begin."""
    runtime = Runtime(
        control_token=CONTROL_TOKEN, handoff_token=HANDOFF_TOKEN, state_adapter=NoteState()
    )
    assert (await export(runtime, OTHER)).status_code == 200
