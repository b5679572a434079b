"""``make test-pythons`` (tests/pythons.py): the versions it expects, and a missing one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_missing_version_fails_early(tmp_path: Path) -> None:
    """With --require (CI), a version the classifiers list and the machine lacks is named,
    and the run stops with status 2 before any environment is made or test run."""
    environment = {"PYENV_ROOT": str(tmp_path), "PATH": str(tmp_path), "HOME": str(tmp_path)}
    finished = subprocess.run(
        [sys.executable, "tests/pythons.py", "--require"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode == 2
    assert "CPython 3.11 is in pyproject.toml's classifiers" in finished.stdout
    assert "CPython 3.13 is in pyproject.toml's classifiers" in finished.stdout
    assert "==" not in finished.stdout  # nothing installed, nothing run
