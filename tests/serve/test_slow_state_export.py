"""A slow state export under ``serve --workers``: handed over within the drain's deadline, and
logged as handed over, never as failed. Real processes (the reliability app, whose export waits
``FZREL_EXPORT_DELAY`` seconds).

Before, the supervisor waited for a worker's import as for any command (10 s): an export of 11 s
under a 20 s drain arrived, yet was logged ``supervisor.state_handoff_failed …
RUNTIME_WORKER_GONE``.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from .conftest import StartSupervised
from .test_handover import _start, revision

pytestmark = pytest.mark.server

#: Past the supervisor's command timeout (10 s), well within the drain's deadline (20 s).
EXPORT_DELAY = "11"


def test_slow_export_handed_over(start_supervised: StartSupervised, tmp_path: Path) -> None:
    """An export of 11 s under a 20 s drain is handed over, and logged so, by both workers."""
    served, revision_file, _ = _start(
        start_supervised, tmp_path, env={"FZREL_EXPORT_DELAY": EXPORT_DELAY}
    )
    revision_file.write_text(revision(2))
    served.signal(signal.SIGHUP)
    served.wait_log("supervisor.handover_done from=1 to=2", bound=60)
    log = served.log()
    assert "supervisor.state_handoff_failed" not in log, log
    assert log.count("supervisor.state_handed_over") == 2, log
