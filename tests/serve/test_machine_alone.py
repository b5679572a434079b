"""The supervisor's decisions can be read, imported and tested without a server: importing
``serve.machine`` or ``serve.table`` imports neither uvicorn nor Starlette."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["serve.machine", "serve.table"])
def test_imports_no_server(module: str) -> None:
    """A fresh interpreter that imports the module has no uvicorn or Starlette loaded."""
    code = (
        f"import sys, forgezero_lifecycle.{module}; "
        "print(','.join(m for m in ('uvicorn', 'starlette') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == ""
