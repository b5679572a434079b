"""A reload while an orchestrator's drain holds the generation is refused (409
``RUNTIME_RELOAD_BUSY``, the drain named; SIGHUP refused and logged): the drain's nonce keeps
answering status from the generation that drains, and a rollback makes a reload possible again.
Real ``serve --workers`` processes.

Before, the handover was accepted: the new generation served and the orchestrator's
``status?nonce=`` answered 404, its drain lost.
"""

from __future__ import annotations

import signal

import pytest

from .conftest import StartSupervised
from .test_generation_drain import BEGIN, REVISION, ROLLBACK, _request, _status

pytestmark = pytest.mark.server

RELOAD = "/.forgezero/runtime/supervisor/v1/reload"


def test_reload_refused_during_drain(start_supervised: StartSupervised) -> None:
    served = start_supervised("--revision", REVISION, "--drain-timeout", "20s", workers=2)
    request = _request(20_000)
    assert served.post(BEGIN, request).status_code == 202
    served.wait_for(lambda: _status(served, request["nonce"])["status"] == "drained", "drained")
    refused = served.post(RELOAD, {})
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "RUNTIME_RELOAD_BUSY"
    assert "drain" in refused.json()["detail"]
    served.signal(signal.SIGHUP)
    served.wait_log("supervisor.reload_refused: a drain holds generation 1")
    assert "supervisor.handover_begin" not in served.log()
    assert _status(served, request["nonce"])["status"] == "drained"  # still answered
    assert served.post(ROLLBACK, {"nonce": request["nonce"]}).status_code == 200
    assert served.post(RELOAD, {}).status_code == 202  # rolled back: a reload is accepted
    served.wait_log("supervisor.handover_done")
