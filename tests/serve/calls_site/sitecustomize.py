"""Loaded at start-up by every process of ``tests/serve/test_sighup_path.py`` (this folder is put
on ``PYTHONPATH``): records when each module of forgezero_lifecycle had a function called, as
10 ms ticks of the system-wide monotonic clock, and writes them at exit to
``$FZ_TEST_CALLS_DIR/<pid>.json``. A module is named by its file (``serve/worker.py``), since a
worker runs its module as ``__main__``. Without that variable it does nothing.

A profile hook, not a trace: it sees calls only (``sys.setprofile``), so it costs one Python
call per function call, for the few seconds the test runs. Only functions count
(``CO_OPTIMIZED`` code): importing a module runs its body and its classes' bodies, and an import
is not a step taken.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from inspect import CO_OPTIMIZED
from pathlib import Path
from types import FrameType
from typing import Any

_DIRECTORY = os.environ.get("FZ_TEST_CALLS_DIR")
_TICK = 100  # per second
_PACKAGE = f"{os.sep}forgezero_lifecycle{os.sep}"


def _install(directory: Path) -> None:
    ticks: dict[str, set[int]] = {}
    monotonic = time.monotonic

    def profile(frame: FrameType, event: str, _: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        _, inside, name = code.co_filename.rpartition(_PACKAGE)
        if inside and code.co_flags & CO_OPTIMIZED:
            ticks.setdefault(name, set()).add(int(monotonic() * _TICK))

    def write() -> None:
        sys.setprofile(None)
        found = {name: sorted(times) for name, times in ticks.items()}
        (directory / f"{os.getpid()}.json").write_text(json.dumps(found))

    atexit.register(write)
    threading.setprofile(profile)
    sys.setprofile(profile)


if _DIRECTORY:
    _install(Path(_DIRECTORY))
