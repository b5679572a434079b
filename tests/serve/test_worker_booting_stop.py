"""A worker still importing its app is stopped the way its lifespan allows (``serve --workers``).

The app (``tests/serve/booting_app.py``) takes a while to import and marks its lifespan's
startup and shutdown. A SIGTERM to the supervisor while the workers import: each worker, once
its import is over, does not serve (never ready, never accepting) and exits 0 within the stop's
short bound, its lifespan shutdown run if its startup ran. An import that outlasts the bound is
killed, and the log says the worker was still booting.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Final

import pytest

from .conftest import StartSupervised, Supervised

pytestmark = pytest.mark.server

APP: Final = "tests.serve.booting_app:app"


def _start(start_supervised: StartSupervised, markers: Path, seconds: float) -> Supervised:
    """Both workers importing (``seconds`` each at most: until ``release`` exists in
    ``markers``); their lifespan shutdown takes 0.5 s."""
    env = {
        "FZB_MARKERS": str(markers),
        "FZB_IMPORT_SECONDS": str(seconds),
        "FZB_SHUTDOWN_SECONDS": "0.5",
    }
    served = start_supervised(target=APP, env=env, wait=False)
    served.wait_for(lambda: len(list(markers.glob("*.importing"))) == 2, "both importing")
    served.workers()  # seen, so the fixture checks none survives
    return served


def test_stop_during_import_exits_cleanly(
    start_supervised: StartSupervised, tmp_path: Path
) -> None:
    """Stopped while importing: no worker serves; each exits 0, its lifespan shut down if it
    started; none is killed; the supervisor exits 1 (the generation never served)."""
    markers = tmp_path / "markers"
    markers.mkdir()
    served = _start(start_supervised, markers, 60)
    served.signal(signal.SIGTERM)
    # The imports end once the supervisor has taken the signal (and sent each worker its stop,
    # in the same turn of its loop), well inside the stop's short bound, on any machine.
    served.wait_log("supervisor.signal signal=SIGTERM")
    (markers / "release").touch()
    assert served.wait_exit() == 1
    log = served.log()
    assert "supervisor.stopped drain=not-started exit=1" in log
    assert "supervisor.worker_killed" not in log
    assert "supervisor.worker_ready" not in log
    assert "worker.accepting" not in log
    for index in range(2):
        assert f"supervisor.worker_exited worker {index} " in log
    assert log.count("reason=exit code 0") == 2, log
    assert log.count("worker.stopped_before_serving") == 2, log
    for importing in markers.glob("*.importing"):
        lifespan = markers / f"{importing.stem}.lifespan"
        ran = lifespan.read_text().split() if lifespan.exists() else []
        assert ran in ([], ["startup", "shutdown"]), (importing.stem, ran, log)


def test_import_past_the_stop_bound_is_killed(
    start_supervised: StartSupervised, tmp_path: Path
) -> None:
    """An import that outlasts the stop's short bound: the worker is killed, and the log says it
    was still booting; its lifespan never ran."""
    markers = tmp_path / "markers"
    markers.mkdir()
    served = _start(start_supervised, markers, 60)
    served.signal(signal.SIGTERM)
    assert served.wait_exit() == 1
    log = served.log()
    assert log.count("supervisor.worker_killed") == 2, log
    assert "not stopped in time, still booting (importing its app" in log
    assert log.count("reason=killed by SIGKILL") == 2, log
    assert list(markers.glob("*.lifespan")) == []
