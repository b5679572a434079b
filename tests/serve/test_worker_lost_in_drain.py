"""A worker lost while its generation drains (an orchestrator's drain, not the stop) is
replaced, and the replacement joins the drain: it refuses intake like its siblings, answers the
drain's status, and the rollback reaches it, so the generation serves with all its workers
again. Real ``serve --workers`` processes, the worker lost to ``kill -9``.

Before, nothing replaced it: after the rollback one of two workers served for good, and with
``--workers 1`` nothing answered on the port at all (not even the rollback).
"""

from __future__ import annotations

import os
import signal

import pytest

from .conftest import AUTH, StartSupervised
from .test_generation_drain import BEGIN, READY, REVISION, ROLLBACK, _request, _status

pytestmark = pytest.mark.server

#: The replacement starts after no backoff (its first attempt) and imports the app: about 1 s.
_REPLACED_BOUND = 15.0


@pytest.mark.parametrize("workers", [1, 2])
def test_worker_lost_in_drain_is_replaced(start_supervised: StartSupervised, workers: int) -> None:
    served = start_supervised("--revision", REVISION, "--drain-timeout", "20s", workers=workers)
    request = _request(20_000)
    assert served.post(BEGIN, request).status_code == 202
    served.wait_for(lambda: _status(served, request["nonce"])["status"] == "drained", "drained")
    lost = served.workers()[0]
    os.kill(lost, signal.SIGKILL)
    served.wait_log("supervisor.worker_replaced", _REPLACED_BOUND)
    assert len(served.workers()) == workers
    # The replacement joined the drain: intake refused there too, the nonce still answers.
    assert served.get(READY).status_code == 503
    assert _status(served, request["nonce"])["status"] in ("drained", "failed")
    rolled = served.post(ROLLBACK, {"nonce": request["nonce"]})
    assert rolled.status_code == 200, rolled.text
    assert served.get(READY).status_code == 200
    pids = set(served.workers())
    assert lost not in pids
    assert served.pids_answering(workers) == pids
    assert served.get("/pid", headers=AUTH).status_code == 200
