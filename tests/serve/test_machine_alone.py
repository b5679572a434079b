"""The supervisor's decisions can be read, imported and tested without a server: importing
``serve.machine`` (its table included) imports neither uvicorn nor Starlette."""

from __future__ import annotations

import subprocess
import sys


def test_imports_no_server() -> None:
    """A fresh interpreter that imports the module has no uvicorn or Starlette loaded."""
    code = (
        "import sys, forgezero_lifecycle.serve.machine; "
        "print(','.join(m for m in ('uvicorn', 'starlette') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == ""
