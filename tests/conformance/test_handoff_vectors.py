"""Every handoff vector of the conformance file, run against :class:`StateHandoffController`.

``handoff_begin`` and ``handoff_sequence`` use a fetch that records and never settles (an httpx
transport) and a manual clock: the one deadline the JavaScript `@forgezero/runtime` lifecycle module
gives fetch as an AbortSignal is, here, the one sleeper parked on the clock. ``handoff_export``
constructs adapters from JSON and exports. ``handoff_envelope`` serves each vector's exact bytes
from real loopback sockets and polls the status until it is no longer pending. Where a vector has a
``port`` field its ``port.expected`` is asserted instead of the JavaScript outcome.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from forgezero_lifecycle._canonical import canonical_json
from forgezero_lifecycle._errors import LifecycleError
from forgezero_lifecycle.core.handoff import StateHandoffController
from forgezero_lifecycle.testing import ManualClock, settle

from ._handoff_harness import RecordingTransport, VectorAdapter, serving
from ._vectors import counts, expected, vectors

pytestmark = pytest.mark.anyio

CATEGORIES = ("handoff_begin", "handoff_sequence", "handoff_export", "handoff_envelope")


def _params(category: str) -> list[Any]:
    return [pytest.param(v, id=v["id"]) for v in vectors(category)]


def _outcome(call: Callable[[], Any]) -> dict[str, Any]:
    try:
        result = call()
    except LifecycleError as exc:
        return {"throws": {"code": exc.code}}
    if hasattr(result, "model_dump"):
        result = result.model_dump(mode="json", exclude_none=True)
    return {"returns": result}


def _expect(outcome: dict[str, Any], wanted: dict[str, Any]) -> None:
    if "throws" in wanted:
        code = wanted["throws"]["code"]
        assert code is not None, "after the port rules every handoff throw carries a code"
        assert outcome == {"throws": {"code": code}}
    else:
        assert outcome == wanted


def _timeout(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def test_all_vectors_collected() -> None:
    """The file's counts match what this module runs, so no vector is silently skipped."""
    assert {c: len(vectors(c)) for c in CATEGORIES} == {c: counts()[c] for c in CATEGORIES}


@pytest.mark.parametrize("vector", _params("handoff_begin"))
async def test_handoff_begin(vector: dict[str, Any]) -> None:
    spec, want = vector["input"], expected(vector)
    transport, clock = RecordingTransport(), ManualClock()
    adapter = VectorAdapter.from_spec(spec["adapter"], spec["adapter"].get("validate", "any"))
    controller = StateHandoffController(adapter, transport=transport, clock=clock)
    request, timeout = json.loads(spec["request_json"]), _timeout(spec["timeoutMs_json"])
    _expect(_outcome(lambda: controller.begin(request, timeout)), want["begin"])
    await settle()
    _expect(_outcome(lambda: controller.status(spec["status_nonce"])), want["status_after"])
    _expect_fetches(transport, clock, want["fetch_calls"])
    await controller.aclose()


def _expect_fetches(transport: RecordingTransport, clock: ManualClock, wanted: list[Any]) -> None:
    assert transport.calls == [
        {k: v for k, v in c.items() if k != "signal_is_abort_signal"} for c in wanted
    ]
    assert clock.sleepers == sum(1 for c in wanted if c["signal_is_abort_signal"])


@pytest.mark.parametrize("vector", _params("handoff_sequence"))
async def test_handoff_sequence(vector: dict[str, Any]) -> None:
    spec, want = vector["input"], expected(vector)
    transport, clock = RecordingTransport(), ManualClock()
    adapter = VectorAdapter.from_spec(spec["adapter"], spec["adapter"].get("validate", "any"))
    controller = StateHandoffController(adapter, transport=transport, clock=clock)
    assert len(spec["steps"]) == len(want["steps"])
    for step, wanted in zip(spec["steps"], want["steps"], strict=True):
        if step["op"] == "begin":
            request, timeout = json.loads(step["request_json"]), _timeout(step["timeoutMs_json"])
            outcome = _outcome(lambda r=request, t=timeout: controller.begin(r, t))
        else:
            assert step["op"] == "status"
            outcome = _outcome(lambda n=step["nonce"]: controller.status(n))
        _expect(outcome, wanted)
        await settle()
    _expect_fetches(transport, clock, want["fetch_calls"])
    await controller.aclose()


@pytest.mark.parametrize("vector", _params("handoff_export"))
async def test_handoff_export(vector: dict[str, Any]) -> None:
    spec, want = vector["input"], expected(vector)
    adapter = VectorAdapter.from_spec(json.loads(spec["adapter_json"]), spec.get("validate", "any"))
    if spec["kind"] == "construct":
        outcome = _outcome(lambda: StateHandoffController(adapter) and {"constructed": True})
        _expect(outcome, want["construct"])
        return
    assert spec["kind"] == "export"
    adapter.exported = json.loads(spec["exported_json"])
    controller = StateHandoffController(adapter)
    try:
        result: Any = await controller.export_state(spec["sourceRevision"], spec["targetRevision"])
        outcome = {"returns": result.model_dump()}
    except LifecycleError as exc:
        outcome = {"throws": {"code": exc.code}}
    _expect(outcome, want["export"])
    assert adapter.export_calls == int(want["adapter_exportState_called"])
    if "returns" in outcome and "envelope_canonical" in want:
        unsigned = {k: v for k, v in outcome["returns"].items() if k != "digest"}
        assert canonical_json(unsigned).decode() == want["envelope_canonical"]
        assert len(canonical_json(unsigned)) == want["envelope_canonical_utf8_bytes"]


@pytest.mark.parametrize("vector", _params("handoff_envelope"))
async def test_handoff_envelope(vector: dict[str, Any]) -> None:
    spec, want = vector["input"], expected(vector)
    adapter = VectorAdapter.from_spec(spec["adapter"], spec["adapter"].get("validate", "any"))
    async with serving(spec["source"]) as sources:
        controller = StateHandoffController(adapter)
        request = json.loads(sources.substitute(spec["request_json"]))
        outcome = _outcome(lambda: controller.begin(request, spec["timeoutMs"]))
        _expect(outcome, want["begin"])
        if "returns" in outcome:
            await _until_settled(controller, request["nonce"], spec["timeoutMs"])
        final = _outcome(lambda: controller.status(request["nonce"]))
        await controller.aclose()
    _expect(final, want["final_status"])
    failure = final.get("returns", {}).get("failure")
    if want["failure_is_code"] is not None:
        assert failure is not None
        assert failure.startswith("RUNTIME_") == want["failure_is_code"]
    assert sources.requests == want["source_requests"]
    assert adapter.import_calls == want["import_calls"]


async def _until_settled(controller: StateHandoffController[Any], nonce: str, ms: Any) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + float(ms) / 1000 + 20
    while controller.status(nonce).status == "pending":
        assert loop.time() < deadline, "the handoff stayed pending past its deadline"
        await asyncio.sleep(0.005)
