"""JobStore contract, results: a result that is not JSON data is refused with JOB_INVALID.

The payload's rules hold for a handler's result too (README, "Durable fenced jobs"): the
completion raises before anything is written, the lease stays held, and a worker fails the
attempt as for any handler exception, so the job runs again or goes ``dead``, never lost.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import anyio
import pytest

from forgezero_lifecycle._errors import JobInvalidError
from forgezero_lifecycle.jobs import JobWorker, Lease
from forgezero_lifecycle.jobs._enqueue import MAX_PAYLOAD_DEPTH

from .conftest import StoreKit

pytestmark = pytest.mark.anyio


def _holding_itself() -> dict[str, Any]:
    result: dict[str, Any] = {}
    result["self"] = result
    return result


def _nested(containers: int) -> Any:
    """``containers`` lists, one inside the other, around ``1``."""
    value: Any = 1
    for _ in range(containers):
        value = [value]
    return value


BAD_RESULTS: dict[str, Any] = {
    "holds-itself": _holding_itself(),
    "too-deep": _nested(MAX_PAYLOAD_DEPTH + 1),
    "nan": float("nan"),
    "infinity-nested": {"x": [float("inf")]},
    "datetime": {"at": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)},
    "uuid": uuid.UUID(int=1),
    "set": {1, 2},
    "object": object(),
    "int-key": {1: "one"},
    "nul": "a\x00b",
    "lone-surrogate": ["\ud800"],
    "int-beyond-64-bits": 2**70,
}


async def _leased(kit: StoreKit, key: str) -> Lease[Any]:
    await kit.store.enqueue("q", {"k": key}, idempotency_key=key)
    (lease,) = await kit.store.claim("w", 1, 30.0)
    return lease


@pytest.mark.parametrize("case", list(BAD_RESULTS))
async def test_non_json_result_refused(kit: StoreKit, case: str) -> None:
    """complete() and complete_many() raise JOB_INVALID, write nothing, and the lease holds."""
    lease = await _leased(kit, case)
    with pytest.raises(JobInvalidError) as caught:
        async with kit.store.complete(lease, BAD_RESULTS[case]):
            pass
    assert caught.value.code == "JOB_INVALID"
    assert "result" in (caught.value.detail or "")
    other = await kit.store.enqueue("q", {"k": "other"})
    (neighbour,) = await kit.store.claim("w", 1, 30.0)
    with pytest.raises(JobInvalidError):
        await kit.store.complete_many([(neighbour, "fine"), (lease, BAD_RESULTS[case])])
    for job_id in (lease.job.id, other.id):
        stored = await kit.store.get(job_id)
        assert stored is not None
        assert (stored.state, stored.result) == ("leased", None)
    assert not lease.settled
    failed = await kit.store.fail(lease, "refused result", retry_in=0.0)
    assert failed.state == "queued"


async def test_deepest_result_accepted(kit: StoreKit) -> None:
    """A result nested exactly as deep as a payload may be is stored and reads back."""
    lease = await _leased(kit, "deep")
    async with kit.store.complete(lease, _nested(MAX_PAYLOAD_DEPTH)):
        pass
    stored = await kit.store.get(lease.job.id)
    assert stored is not None
    assert (stored.state, stored.result) == ("done", _nested(MAX_PAYLOAD_DEPTH))


@pytest.mark.parametrize("case", ["holds-itself", "too-deep", "nul", "datetime"])
async def test_worker_fails_bad_result(kit: StoreKit, case: str) -> None:
    """The job is retried, then dead at max_attempts with JOB_INVALID; its batch completes."""
    worker = JobWorker(
        kit.store, concurrency=4, lease=5.0, idle_interval=0.02, owner="w", backoff=lambda _: 0.0
    )

    @worker.handler("r")
    async def handle(lease: Lease[Any]) -> Any:
        return BAD_RESULTS[case] if lease.job.payload["bad"] else lease.job.payload["n"]

    bad = await kit.store.enqueue("r", {"bad": True, "n": 0}, max_attempts=2)
    good = [await kit.store.enqueue("r", {"bad": False, "n": n}) for n in range(1, 4)]
    worker.start()
    try:
        with anyio.fail_after(15):
            stored = await kit.store.get(bad.id)
            while stored is None or stored.state != "dead":
                await anyio.sleep(0.02)
                stored = await kit.store.get(bad.id)
            # Polling: the worker has no completion event to await; fail_after bounds the wait.
            while worker.statistics().completed < 3:  # noqa: ASYNC110
                await anyio.sleep(0.02)
    finally:
        await worker.stop(timeout=2.0)
    assert stored.attempts == 2
    assert stored.last_error is not None
    assert stored.last_error.startswith("JobInvalidError: JOB_INVALID")
    assert worker.statistics().failed == 2
    for job in good:
        done = await kit.store.get(job.id)
        assert done is not None
        assert (done.state, done.result) == ("done", job.payload["n"])
