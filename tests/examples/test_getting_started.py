"""docs/getting-started.md runs as written: its app, then its commands in one shell.

The app (examples/quickstart/main.py, which the page includes as it is, and the README shows) is
saved as ``main.py`` in a git repository of its own; the page's commands then run in order: serve
on a free port, a drain begun and followed with ``curl``, rolled back, drained again with the
CLI, and SIGTERM. Substituted: the port, and the ``pip install`` lines (the test environment has
the extras).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Final

import pytest

from tests.cli.conftest import free_port

from ._shell import clean_env, run_shell

ROOT: Final = Path(__file__).resolve().parents[2]
PAGE: Final = (ROOT / "docs" / "getting-started.md").read_text()


@pytest.mark.server
def test_commands_run_as_written(tmp_path: Path) -> None:
    """The getting-started commands run as written."""
    assert '--8<-- "examples/quickstart/main.py"' in PAGE
    shutil.copy(ROOT / "examples" / "quickstart" / "main.py", tmp_path / "main.py")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    for command in (["init", "-q"], ["add", "main.py"], ["commit", "-q", "-m", "main"]):
        subprocess.run([*git, *command], cwd=tmp_path, check=True, capture_output=True)
    blocks = re.findall(r"^```console\n(.*?)^```$", PAGE, re.MULTILINE | re.DOTALL)
    install, *commands = blocks
    assert all(line.startswith("pip install") for line in install.strip().splitlines())
    assert len(commands) == 5  # start, drain with curl, rollback, drain with the CLI, stop
    port = str(free_port())
    code, out = run_shell("".join(commands).replace("8000", port), tmp_path, clean_env())
    assert code == 0, out
    assert '{"accepted":true,"duplicate":false}' in out, out  # begin, with curl
    assert re.search(r'"status":"drain(ing|ed)"', out), out  # its status, with curl
    assert '"status":"rolled-back"' in out, out
    assert re.search(r"drained\s+http=0 websocket=0 jobs=0 schedules=0", out), out  # the CLI
    assert "serve.stopped drain=drained" in out, out
