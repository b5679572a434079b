"""Under ``serve --workers`` every process logs the same drain events: each line says whose."""

from __future__ import annotations

import signal

import pytest

from .conftest import StartSupervised

pytestmark = pytest.mark.server


def test_drain_events_labelled(
    start_supervised: StartSupervised,
) -> None:
    """Each drain event names the process that logged it: the supervisor's and each worker's
    ``drain.begin`` and ``drain.drained`` end with a label (they were three identical lines with two
    workers)."""
    served = start_supervised(workers=2)
    served.signal(signal.SIGTERM)
    assert served.wait_exit() == 0
    for event in ("drain.begin", "drain.drained"):
        lines = [line for line in served.log().splitlines() if f" {event} " in line]
        labels = sorted(line.rsplit(" ", 1)[-1] for line in lines)
        ends = sorted(" ".join(line.split()[-2:]) for line in lines if "worker=" in line)
        assert len(lines) == 3, lines
        assert labels.count("supervisor") == 1, lines
        assert ends == ["worker=0 generation=1", "worker=1 generation=1"], lines
