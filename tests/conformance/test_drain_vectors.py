"""Every drain vector of the conformance file, run against :class:`DrainController`.

The dependencies are the vectors' script: ``wait_for_requests``, ``stop_jobs`` and ``sleep``
return futures the script resolves or rejects, ``drain_requests`` only records, and after every
step the event loop runs until quiet (the JS harness's "pending async work runs to quiescence").
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from forgezero_lifecycle._errors import LifecycleError
from forgezero_lifecycle.core.drain import DrainController
from forgezero_lifecycle.testing import settle

from ._vectors import counts, expected, vectors

pytestmark = pytest.mark.anyio


class ScriptedDependencies:
    """The vectors' dependency script, recording calls in the JavaScript module's names."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.calls: list[dict[str, Any]] = []
        self.sync_throw: dict[str, str] = spec.get("sync_throw", {})
        initial = spec.get("initial_counters_json")
        self.counters: Any = (
            json.loads(initial)
            if initial
            else {"http": 0, "websocket": 0, "jobs": 0, "schedules": 0}
        )
        self.counters_error: str | None = None
        self.deferred: dict[str, asyncio.Future[None]] = {}

    def _call(self, fn: str, *args: Any) -> None:
        self.calls.append({"fn": fn, "args": list(args)})
        if fn in self.sync_throw:
            raise RuntimeError(self.sync_throw[fn])

    def _future(self, name: str) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.deferred[name] = future
        return future

    def drain_requests(self) -> None:
        self._call("drainRequests")

    def wait_for_requests(self) -> asyncio.Future[None]:
        self._call("waitForRequests")
        return self._future("requests")

    def stop_jobs(self, timeout_ms: int) -> asyncio.Future[None]:
        self._call("stopJobs", timeout_ms)
        return self._future("jobs")

    def sleep(self, ms: int) -> asyncio.Future[None]:
        self._call("sleep", ms)
        return self._future("sleep")

    def work_counters(self) -> Any:
        if self.counters_error is not None:
            raise RuntimeError(self.counters_error)
        return self.counters

    def resume(self) -> None:
        self.calls.append({"fn": "resume", "args": []})


def outcome(call: Any, argument: Any) -> dict[str, Any]:
    try:
        value = call(argument)
    except LifecycleError as error:
        return {"throws": {"code": error.code}}
    except Exception as error:
        return {"throws": {"code": None, "message": str(error)}}
    return {"returns": value.model_dump(mode="json", exclude_none=True)}


def comparable(expected_outcome: dict[str, Any] | None) -> dict[str, Any] | None:
    """Reduce an expected outcome to what the port must match (codes, not engine text)."""
    if expected_outcome is None or "returns" in expected_outcome:
        return expected_outcome
    thrown = expected_outcome["throws"]
    if thrown["code"] is None:
        return {"throws": {"code": None, "message": thrown["message"]}}
    return {"throws": {"code": thrown["code"]}}


async def run_script(spec: dict[str, Any], steps: list[dict[str, Any]]) -> tuple[list[Any], Any]:
    deps = ScriptedDependencies(spec)
    controller = DrainController(deps)
    results: list[Any] = []
    for step in steps:
        op = step["op"]
        if op == "begin":
            results.append(outcome(controller.begin, json.loads(step["request_json"])))
        elif op == "status":
            results.append(outcome(controller.status, step["nonce"]))
        else:
            target = deps.deferred.get(step.get("target", ""))
            if op in ("resolve", "reject") and (target is None or target.done()):
                pass  # settling a settled JS deferred is a no-op; the controller cancels losers
            elif op == "resolve":
                deps.deferred[step["target"]].set_result(None)
            elif op == "reject":
                error = step["error"]
                # A JS rejection with a non-Error value carries no message; in Python that is
                # an exception without arguments.
                exc = RuntimeError(error["message"]) if error["kind"] == "error" else RuntimeError()
                deps.deferred[step["target"]].set_exception(exc)
            elif op == "set_counters":
                deps.counters = json.loads(step["counters_json"])
                deps.counters_error = None
            elif op == "counters_throw":
                deps.counters_error = step["message"]
            else:  # pragma: no cover - a new op in the vectors must fail loudly
                raise AssertionError(f"unknown op {op!r}")
            results.append(None)
        await settle()
    for future in deps.deferred.values():
        if not future.done():
            future.cancel()
    await settle()
    return results, deps.calls


DRAIN_BEGIN = vectors("drain_begin")
DRAIN_SCRIPTS = vectors("drain_sequence", "drain_outcome")


def test_all_vectors_collected() -> None:
    """The suite runs as many vectors as the file declares; none is silently dropped."""
    declared = counts()
    assert len(DRAIN_BEGIN) == declared["drain_begin"]
    assert len(DRAIN_SCRIPTS) == declared["drain_sequence"] + declared["drain_outcome"]


@pytest.mark.parametrize("vector", DRAIN_BEGIN, ids=[v["id"] for v in DRAIN_BEGIN])
async def test_drain_begin_vector(vector: dict[str, Any]) -> None:
    """begin() then status() answer as the JavaScript module does, or as the port rule requires."""
    inp, want = vector["input"], expected(vector)
    spec = {"initial_counters_json": json.dumps(inp["counters"])} if "counters" in inp else {}
    steps = [
        {"op": "begin", "request_json": inp["request_json"]},
        {"op": "status", "nonce": inp["status_nonce"]},
    ]
    results, calls = await run_script(spec, steps)
    assert results == [comparable(want["begin"]), comparable(want["status_after"])]
    assert calls == want["calls"]


@pytest.mark.parametrize("vector", DRAIN_SCRIPTS, ids=[v["id"] for v in DRAIN_SCRIPTS])
async def test_drain_script_vector(vector: dict[str, Any]) -> None:
    """A scripted sequence of begin/status/resolve/reject steps gives the original's outcomes."""
    inp, want = vector["input"], expected(vector)
    results, calls = await run_script(inp.get("dependencies", {}), inp["steps"])
    assert results == [comparable(step) for step in want["steps"]]
    assert calls == want["calls"]
