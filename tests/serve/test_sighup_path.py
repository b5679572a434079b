"""The SIGHUP path, measured: the modules whose functions run, in the supervisor and in both
generations' workers, from the SIGHUP to the old generation's exit.

Every process of a real ``serve --workers 1`` records when each module of the library had a
function called (``tests/serve/calls_site/sitecustomize.py``, a profile hook loaded through
``PYTHONPATH``). The handover's own code is the ``serve`` and ``stop`` packages and what they
rely on of uvicorn's internals (``_internals.uvicorn``): at most ten modules. The rest of what
runs is named too, so the figure can be read against it: the runtime's drain (the same drain an
orchestrator begins), the check of asyncio's internals every serving process makes at start-up,
and the wire types.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path
from typing import Final

import pytest

from .conftest import StartSupervised, alive

pytestmark = pytest.mark.server

SITE: Final = Path(__file__).with_name("calls_site")
#: The handover's own code: these packages and modules (a prefix of the module's name).
OWN: Final = ("serve/", "stop/", "_internals/uvicorn.py")
#: The issue's bound on the modules a reader follows from the SIGHUP to the old generation's exit.
MOST: Final = 10


def _called(directory: Path, began: float, ended: float) -> set[str]:
    """The modules with a call between ``began`` and ``ended`` in any process's record."""
    low, high = math.floor(began * 100), math.ceil(ended * 100)
    found: set[str] = set()
    for path in directory.glob("*.json"):
        for module, ticks in json.loads(path.read_text()).items():
            if any(low <= tick <= high for tick in ticks):
                found.add(module)
    return found


def test_sighup_path_stays_within_ten_modules(
    start_supervised: StartSupervised, tmp_path: Path
) -> None:
    calls = tmp_path / "calls"
    calls.mkdir()
    path = os.pathsep.join(filter(None, (str(SITE), os.environ.get("PYTHONPATH"))))
    served = start_supervised(workers=1, env={"PYTHONPATH": path, "FZ_TEST_CALLS_DIR": str(calls)})
    (old,) = served.workers()
    began = time.monotonic()
    served.signal(signal.SIGHUP)
    served.wait_log("supervisor.handover_done")
    served.wait_for(lambda: not alive(old), "the old worker gone")
    ended = time.monotonic()
    served.signal(signal.SIGTERM)
    assert served.wait_exit() == 0, served.log()
    assert len(list(calls.glob("*.json"))) == 3, "a process wrote no record"

    called = _called(calls, began, ended)
    own = sorted(module for module in called if module.startswith(OWN))
    print("the handover's own code:", *own, sep="\n  ")
    print("the rest:", *sorted(called - set(own)), sep="\n  ")
    assert "serve/supervisor.py" in own  # the record covers the supervisor
    assert "serve/worker.py" in own  # and the workers
    assert len(own) <= MOST, own
