"""One drain for the generation: begun through any worker's port, it reaches every worker.

The drain is driven through the public port exactly as an orchestrator would (the wire protocol
is unchanged); each worker's own records (one file per PID) say what it did.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import threading
from typing import Any

import httpx
import pytest

from forgezero_lifecycle.core._httpx import tls_context
from tests._starlette_routes import needs_route_in_scope

from .conftest import AUTH, StartSupervised, Supervised

pytestmark = pytest.mark.server

REVISION = hashlib.sha1(b"serve workers tests").hexdigest()
BEGIN = "/.forgezero/runtime/drain/v1/begin"
STATUS = "/.forgezero/runtime/drain/v1/status"
ROLLBACK = "/.forgezero/runtime/drain/v1/rollback"
READY = "/.forgezero/runtime/ready"


def _request(timeout_ms: int = 10_000) -> dict[str, Any]:
    return {
        "protocol": "forgezero-drain/v1",
        "nonce": secrets.token_urlsafe(32),
        "sourceRevision": REVISION,
        "targetRevision": REVISION,
        "timeoutMs": timeout_ms,
    }


def _status(served: Supervised, nonce: str) -> dict[str, Any]:
    response = served.get(STATUS, params={"nonce": nonce}, headers=AUTH)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def _hold(served: Supervised, count: int, seconds: float | str) -> list[Any]:
    """``count`` slow requests in flight (each on its own connection), admitted when this returns;
    ``seconds`` long, or, given a name, until :func:`_release` of that name."""
    outcomes: list[Any] = []
    query = f"until={seconds}" if isinstance(seconds, str) else f"seconds={seconds}"

    def call() -> None:
        try:
            outcomes.append(served.get(f"/slow?{query}").json())
        except (httpx.HTTPError, ValueError) as error:
            outcomes.append(error)

    for _ in range(count):
        threading.Thread(target=call, daemon=True).start()
    served.wait_for(
        lambda: (
            sum(
                line == "admitted /slow"
                for lines in served.worker_records().values()
                for line in lines
            )
            >= count
        ),
        f"{count} admitted",
    )
    return outcomes


def _release(served: Supervised, name: str) -> None:
    """End the requests :func:`_hold` holds under ``name``."""
    (served.records / name).touch()


@pytest.mark.parametrize("workers", [2, 3])
def test_drain_reaches_every_worker(start_supervised: StartSupervised, workers: int) -> None:
    """A drain through the port reaches every worker: each drains, readiness is 503 on 20 of 20
    polls, counters are the sums."""
    served = start_supervised("--revision", REVISION, workers=workers)
    pids = set(served.workers())
    assert served.pids_answering(workers) == pids
    held = _hold(served, 3, "held")  # until released below, however slow the checks are
    request = _request()
    begun = served.post(BEGIN, request)
    assert begun.status_code == 202, begun.text
    assert begun.json() == {"accepted": True, "duplicate": False}
    assert [served.get(READY).status_code for _ in range(20)] == [503] * 20
    status = _status(served, request["nonce"])
    assert status["status"] == "draining"
    assert status["inFlight"]["http"] == 3
    per_worker = status["detail"]["workers"]
    assert {w["pid"] for w in per_worker} == pids
    assert sum(w["inFlight"]["http"] for w in per_worker) == 3
    refused = served.get("/pid")
    assert refused.status_code == 503
    assert refused.json() == {"error": "RUNTIME_DRAINING"}
    _release(served, "held")
    final = served.wait_for(
        lambda: (s := _status(served, request["nonce"]))["status"] != "draining" and s, "settled"
    )
    assert final["status"] == "drained", final
    assert final["inFlight"] == {"http": 0, "websocket": 0, "jobs": 0, "schedules": 0}
    assert all(isinstance(o, dict) and o["pid"] in pids for o in held), held
    records = served.worker_records()
    assert set(records) == pids
    for pid in pids:
        assert "draining" in records[pid], (pid, records[pid])
        assert "settled drained" in records[pid], (pid, records[pid])


def test_retry_and_conflict(
    start_supervised: StartSupervised,
) -> None:
    """The generation validates once, with the single-process codes: an exact retry is a duplicate
    and another nonce conflicts."""
    served = start_supervised("--revision", REVISION, workers=2)
    request = _request()
    assert served.post(BEGIN, request).status_code == 202
    again = served.post(BEGIN, request)
    assert again.status_code == 202
    assert again.json()["duplicate"] is True
    other = served.post(BEGIN, _request())
    assert other.status_code == 409
    assert other.json()["error"] == "RUNTIME_DRAIN_ALREADY_STARTED"
    wrong = served.post(BEGIN, {**_request(), "sourceRevision": "b" * 40})
    assert wrong.status_code == 409
    assert wrong.json()["error"] == "RUNTIME_DRAIN_REVISION_MISMATCH"
    unauthenticated = httpx.post(
        served.url + BEGIN, json=_request(), trust_env=False, verify=tls_context()
    )
    assert unauthenticated.status_code == 401
    assert served.get(STATUS, params={"nonce": "x" * 43}, headers=AUTH).status_code == 404


def test_rollback_restores_workers(start_supervised: StartSupervised) -> None:
    """After rollback every worker is ready and serving again, and says so in its records."""
    served = start_supervised("--revision", REVISION, workers=2)
    pids = set(served.workers())
    request = _request()
    assert served.post(BEGIN, request).status_code == 202
    rolled = served.post(ROLLBACK, {"nonce": request["nonce"]})
    assert rolled.status_code == 200, rolled.text
    assert rolled.json()["status"] == "rolled-back"
    assert [served.get(READY).status_code for _ in range(20)] == [200] * 20
    assert served.pids_answering(2) == pids
    records = served.worker_records()
    for pid in pids:
        assert "resumed" in records[pid], (
            pid,
            records[pid],
        )
    again = _request()
    assert served.post(BEGIN, again).status_code == 202


def test_failed_worker_fails_drain(start_supervised: StartSupervised) -> None:
    """A worker whose request outlives the deadline fails, and the generation's drain with it; the
    failed worker is named."""
    served = start_supervised("--revision", REVISION, workers=2)
    held = _hold(served, 1, 3.0)
    request = _request(timeout_ms=500)
    assert served.post(BEGIN, request).status_code == 202
    final = served.wait_for(
        lambda: (s := _status(served, request["nonce"]))["status"] != "draining" and s, "settled"
    )
    assert final["status"] == "failed", final
    served.wait_for(lambda: held, "the held request answered")
    holder = held[0]["pid"]

    def failed_pids() -> list[int]:
        workers = _status(served, request["nonce"])["detail"]["workers"]
        return [w["pid"] for w in workers if w["status"] == "failed"]

    # The supervisor's deadline and the worker's are the same instant; the worker's report of
    # its own failure may reach the supervisor after the generation's status says failed.
    served.wait_for(lambda: holder in failed_pids(), "the holder named failed")
    records = served.worker_records()
    assert "settled failed" in records[holder]


def test_schedules_status(start_supervised: StartSupervised) -> None:
    """``schedules/v1/status`` is answered for the generation: each worker's schedules, named."""
    served = start_supervised(workers=2)
    pids = set(served.workers())
    response = served.get("/.forgezero/runtime/schedules/v1/status", headers=AUTH)
    assert response.status_code == 200
    schedules = response.json()["schedules"]
    assert sorted(entry["worker"] for entry in schedules) == [0, 1]
    assert {entry["pid"] for entry in schedules} == pids
    assert {entry["name"] for entry in schedules} == {"hourly"}
    assert served.get("/.forgezero/runtime/schedules/v1/status").status_code == 401


def test_worker_death_fails_drain(start_supervised: StartSupervised) -> None:
    """SIGKILL of a worker still draining: the generation's drain fails, naming that worker;
    a replacement joins the drain."""
    served = start_supervised("--revision", REVISION, workers=2)
    _hold(served, 1, "never")  # its worker is killed holding it
    request = _request(timeout_ms=20_000)
    assert served.post(BEGIN, request).status_code == 202
    # The worker still draining (it holds the request); the other may have drained already.
    (victim,) = [pid for pid, lines in served.worker_records().items() if "admitted /slow" in lines]
    os.kill(victim, signal.SIGKILL)
    final = served.wait_for(
        lambda: (s := _status(served, request["nonce"]))["status"] != "draining" and s, "settled"
    )
    assert final["status"] == "failed", final
    dead = [w for w in final["detail"]["workers"] if w["pid"] == victim]
    assert dead[0]["exited"] == "killed by SIGKILL"
    assert dead[0]["worker"] in final["detail"]["failedWorkers"]
    served.wait_log(f"pid {victim}) of generation 1 reason=killed by SIGKILL")
    # Replaced (it takes about 1 s to import: the status above came first), the replacement
    # joining the failed drain until the rollback (tests/serve/test_worker_lost_in_drain.py).
    served.wait_log("supervisor.drain_joined")
    assert len(served.workers()) == 2


def test_current_drain_any_worker(start_supervised: StartSupervised) -> None:
    """``drain/v1/current`` (no nonce) answers for the generation from any worker."""
    served = start_supervised("--revision", REVISION, workers=2)
    current = "/.forgezero/runtime/drain/v1/current"
    assert served.get(current, headers=AUTH).status_code == 404
    request = _request()
    assert served.post(BEGIN, request).status_code == 202
    for _ in range(10):  # new connections: any worker may answer
        response = served.get(current, headers=AUTH)
        assert response.status_code == 200, response.text
        assert response.json()["nonce"] == request["nonce"]
        assert len(response.json()["detail"]["workers"]) == 2


@needs_route_in_scope()
def test_status_names_the_oldest_requests_of_every_worker(
    start_supervised: StartSupervised,
) -> None:
    """Under serve --workers a drain's status names the oldest requests of the whole generation,
    each with the worker running it, its route template and age; never its query."""
    served = start_supervised("--revision", REVISION, workers=2)
    _hold(served, 2, "held")
    request = _request()
    assert served.post(BEGIN, request).status_code == 202
    status = _status(served, request["nonce"])
    items = status["detail"]["oldestInFlight"]
    assert [(i["kind"], i["method"], i["route"]) for i in items] == [("http", "GET", "/slow")] * 2
    assert all(i["worker"] in (0, 1) and isinstance(i["ageMs"], int) for i in items), items
    assert "until=" not in str(status)
    rolled = served.post(ROLLBACK, {"nonce": request["nonce"]})
    assert rolled.json()["status"] == "rolled-back"
    _release(served, "held")
