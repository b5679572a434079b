"""tests/serve/apps.py's app, which starts two helper processes as it is imported, the way apps
do: ``os.system("sleep 120 &")`` (a shell, which closes no descriptor it inherits) and
``subprocess.Popen(["sleep", "120"])``. Each helper's PID is appended to the file
``FZW_HELPERS`` names (``shell <pid>`` and ``popen <pid>``), for the test to look at and kill.
"""

from __future__ import annotations

import os
import shlex
import subprocess

from tests.serve.apps import app

__all__ = ["app"]

_HELPERS = os.environ["FZW_HELPERS"]
os.system(f"sleep 120 & echo shell $! >> {shlex.quote(_HELPERS)}")
_POPEN = subprocess.Popen(["sleep", "120"])
with open(_HELPERS, "a") as helpers:
    helpers.write(f"popen {_POPEN.pid}\n")
