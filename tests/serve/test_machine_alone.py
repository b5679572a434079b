"""The supervisor's decisions can be read, imported and tested without a server: importing
``serve.machine`` (its table included) imports neither uvicorn nor Starlette. And the other way
round: a worker process never imports the machine, whose hundred dataclasses would cost every
worker's start about 35 ms of CPU."""

from __future__ import annotations

import subprocess
import sys


def _loaded_after(module: str, names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` a fresh interpreter has loaded once it imported ``module``."""
    code = f"import sys, {module}; print(','.join(m for m in {names!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return [name for name in done.stdout.strip().split(",") if name]


def test_imports_no_server() -> None:
    """A fresh interpreter that imports the module has no uvicorn or Starlette loaded."""
    assert _loaded_after("forgezero_lifecycle.serve.machine", ("uvicorn", "starlette")) == []


def test_worker_does_not_import_the_machine() -> None:
    """Everything a worker process imports to serve leaves the machine out."""
    machine = "forgezero_lifecycle.serve.machine"
    assert _loaded_after("forgezero_lifecycle.serve.worker", (machine,)) == []
