"""DrainController beyond the JavaScript original: rollback, revision check, nonce reuse, wait()."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from forgezero_lifecycle._errors import (
    DrainConflictError,
    DrainNotFoundError,
    DrainRequestInvalidError,
)
from forgezero_lifecycle.core.drain import DrainController
from forgezero_lifecycle.testing import ManualClock, settle
from forgezero_lifecycle.wire.drain import WorkCounters

pytestmark = pytest.mark.anyio

NONCE = "A" * 43
OTHER = "B" * 43
SRC = "0" * 40
TGT = "f" * 40


def request(nonce: str = NONCE, source: str = SRC, timeout_ms: int = 1000) -> dict[str, Any]:
    return {
        "protocol": "forgezero-drain/v1",
        "nonce": nonce,
        "sourceRevision": source,
        "targetRevision": TGT,
        "timeoutMs": timeout_ms,
    }


class Deps:
    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.requests_done = asyncio.Event()
        self.counters = WorkCounters()
        self.calls: list[str] = []

    def drain_requests(self) -> None:
        self.calls.append("drain_requests")

    async def wait_for_requests(self) -> None:
        await self.requests_done.wait()

    async def stop_jobs(self, timeout_ms: int) -> None:
        return None

    def work_counters(self) -> WorkCounters:
        return self.counters

    async def sleep(self, ms: int) -> None:
        await self.clock.sleep(ms / 1000)

    def resume(self) -> None:
        self.calls.append("resume")


@pytest.fixture
def deps() -> Deps:
    return Deps(ManualClock())


async def test_drained_when_work_done(deps: Deps) -> None:
    """Once requests and jobs are done and every counter is 0, the drain is drained."""
    controller = DrainController(deps)
    controller.begin(request())
    deps.requests_done.set()
    assert await controller.wait() == "drained"
    assert controller.status(NONCE).status == "drained"


async def test_deadline_fails_drain(deps: Deps) -> None:
    """Work still running at the deadline ends failed RUNTIME_DRAIN_TIMEOUT, counters kept."""
    controller = DrainController(deps)
    controller.begin(request(timeout_ms=500))
    deps.counters = WorkCounters(http=2)
    await deps.clock.advance(0.5)
    status = controller.status(NONCE)
    assert (status.status, status.failure, status.in_flight.http) == (
        "failed",
        "RUNTIME_DRAIN_TIMEOUT",
        2,
    )


async def test_rollback_then_fresh_nonce(deps: Deps) -> None:
    """Rollback calls resume(), reports rolled-back, and a new nonce starts a new drain."""
    controller = DrainController(deps)
    controller.begin(request())
    rolled = controller.rollback(NONCE)
    assert rolled.status == "rolled-back"
    assert deps.calls == ["drain_requests", "resume"]
    assert controller.begin(request(OTHER)).duplicate is False
    assert controller.status(OTHER).status == "draining"


async def test_rollback_is_idempotent(deps: Deps) -> None:
    """A second rollback of the same drain changes nothing and calls resume() once."""
    controller = DrainController(deps)
    controller.begin(request())
    controller.rollback(NONCE)
    controller.rollback(NONCE)
    assert deps.calls.count("resume") == 1


async def test_rolled_back_nonce_refused(deps: Deps) -> None:
    """Nonce reuse after rollback is refused: a new drain needs a fresh nonce."""
    controller = DrainController(deps)
    controller.begin(request())
    controller.rollback(NONCE)
    with pytest.raises(DrainConflictError) as caught:
        controller.begin(request())
    assert caught.value.code == "RUNTIME_DRAIN_ALREADY_STARTED"


async def test_rollback_unknown_nonce(deps: Deps) -> None:
    """Rollback needs the running drain's nonce; anything else is not found and changes nothing."""
    controller = DrainController(deps)
    with pytest.raises(DrainNotFoundError):
        controller.rollback(NONCE)
    controller.begin(request())
    with pytest.raises(DrainNotFoundError):
        controller.rollback(OTHER)
    assert deps.calls == ["drain_requests"]


async def test_rollback_stops_settling(deps: Deps) -> None:
    """After rollback the old drain's deadline no longer turns the status to failed."""
    controller = DrainController(deps)
    controller.begin(request(timeout_ms=500))
    controller.rollback(NONCE)
    await deps.clock.advance(1)
    await settle()
    assert controller.status(NONCE).status == "rolled-back"


async def test_revision_mismatch_refused(deps: Deps) -> None:
    """A runtime that knows its revision refuses a drain aimed at another one (409)."""
    controller = DrainController(deps, revision="1" * 40)
    with pytest.raises(DrainConflictError) as caught:
        controller.begin(request())
    assert caught.value.code == "RUNTIME_DRAIN_REVISION_MISMATCH"
    assert deps.calls == []
    with pytest.raises(DrainNotFoundError):
        controller.status(NONCE)


@pytest.mark.parametrize(
    "body",
    [None, [], "x", 1, {"protocol": "forgezero-drain/v1"}, {**request(), "timeoutMs": "100"}],
)
async def test_invalid_request_no_drain(deps: Deps, body: object) -> None:
    """Anything but a valid request object is RUNTIME_DRAIN_REQUEST_INVALID and no drain starts."""
    controller = DrainController(deps)
    with pytest.raises(DrainRequestInvalidError):
        controller.begin(body)
    assert deps.calls == []
    assert not controller.active


async def test_current_finds_drain(deps: Deps) -> None:
    """current() needs no nonce: it reports the running drain (drained too), none once serving."""
    controller = DrainController(deps)
    with pytest.raises(DrainNotFoundError, match="serving"):
        controller.current()
    controller.begin(request())
    assert (controller.current().nonce, controller.current().status) == (NONCE, "draining")
    deps.requests_done.set()
    assert await controller.wait() == "drained"
    assert controller.current() == controller.status(NONCE)
    controller.rollback(NONCE)
    with pytest.raises(DrainNotFoundError):
        controller.current()
    assert controller.status(NONCE).status == "rolled-back"


async def test_controller_owns_deadline(deps: Deps) -> None:
    """timeout and remaining() come from the request begun, on the controller's clock."""
    controller = DrainController(deps, clock=deps.clock)
    assert controller.timeout == 0.0
    controller.begin(request(timeout_ms=2000))
    assert controller.timeout == 2.0
    await deps.clock.advance(0.5)
    assert controller.remaining() == 1.5
    await deps.clock.advance(5)
    assert controller.remaining() == 0.0


async def test_drain_records_origin(deps: Deps, caplog: pytest.LogCaptureFixture) -> None:
    """begin's origin is the drain's, read by the dependencies and logged with drain.begin."""
    controller = DrainController(deps)
    assert controller.origin == "control"
    with caplog.at_level("INFO", logger="forgezero_lifecycle.drain"):
        controller.begin(request(), origin="signal")
    assert controller.origin == "signal"
    assert any(
        "drain.begin" in r.getMessage() and "origin=signal" in r.getMessage()
        for r in caplog.records
    )
    controller.rollback(NONCE)
    controller.begin(request(OTHER))
    assert controller.origin == "control"
