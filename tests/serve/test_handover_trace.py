"""A real ``serve --workers`` handover, traced: its span holds the supervisor's steps, and the
drain of the generation it retired is its child (tests/serve/traced_supervisor.py sets up the
SDK in the supervisor's process, as ``opentelemetry-instrument`` would)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from .conftest import AUTH, StartSupervised

pytestmark = pytest.mark.server

HANDOVER = "/.forgezero/runtime/supervisor/v1/handover"


def test_handover_span_with_generation_drain_child(
    start_supervised: StartSupervised, tmp_path: Path
) -> None:
    """SIGHUP's handover ends a forgezero.handover span (its steps as events, done), whose child
    is generation 1's forgezero.drain; the stop's drain of generation 2 is a root span."""
    spans_file = tmp_path / "spans.jsonl"
    served = start_supervised(
        workers=2, module="tests.serve.traced_supervisor", env={"FZW_SPANS": str(spans_file)}
    )
    served.signal(signal.SIGHUP)
    served.wait_for(
        lambda: served.get(HANDOVER, headers=AUTH).json().get("state") == "done", "handover done"
    )
    served.signal(signal.SIGTERM)
    assert served.wait_exit() == 0, served.log()
    spans: list[dict[str, Any]] = [json.loads(line) for line in spans_file.read_text().splitlines()]
    [handover] = [span for span in spans if span["name"] == "forgezero.handover"]
    drains = {
        span["attributes"]["forgezero.generation"]: span
        for span in spans
        if span["name"] == "forgezero.drain"
    }
    assert handover["status"] == "UNSET"
    assert handover["attributes"]["forgezero.handover.state"] == "done"
    assert handover["attributes"]["forgezero.handover.to_generation"] == 2
    steps = ["start generation", "accept", "prove", "stop accepting", "start grace", "begin drain"]
    assert handover["events"][: len(steps)] == steps, handover["events"]
    assert "stop workers" in handover["events"]
    assert drains[1]["parent_id"] == handover["span_id"]
    assert drains[1]["events"][-1] == "drained"
    assert drains[2]["parent_id"] is None  # the stop's drain: no handover runs
