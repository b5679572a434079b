"""docs/getting-started.md runs as written: its app, then its commands in one shell.

The app (examples/quickstart/main.py, shown on the page as it is, and in the README) is saved as
``main.py`` with the page's WebSocket route after it, and the WebSocket client as
``ws_client.py``; the page's commands then run in order: serve on a free port, a drain begun and
followed with ``curl``, rolled back, a WebSocket opened and drained with the CLI (it gets 1012),
and SIGTERM. Substituted: the port, and the install lines (the test environment has the extras).
The server tabs are not run here: tests/real_servers start uvicorn, gunicorn and hypercorn.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import pytest

from tests.cli.conftest import free_port

from ._shell import clean_env, run_shell

ROOT: Final = Path(__file__).resolve().parents[2]
PAGE: Final = (ROOT / "docs" / "getting-started.md").read_text()


def blocks(language: str) -> list[str]:
    """The page's ``language`` blocks outside the servers' tabs (``/// tab | ...`` to ``///``)."""
    outside_tabs = re.sub(r"^/// tab \|.*?^///$", "", PAGE, flags=re.MULTILINE | re.DOTALL)
    return re.findall(rf"^```{language}\n(.*?)^```$", outside_tabs, re.MULTILINE | re.DOTALL)


def test_app_is_the_quick_start() -> None:
    """The page shows examples/quickstart/main.py whole, not an include line."""
    app, *_ = blocks("python")
    assert app == (ROOT / "examples" / "quickstart" / "main.py").read_text()


def test_install_from_checkout() -> None:
    """A venv first, then installs from the checkout (the published form only in prose)."""
    install, *_ = blocks("console")
    lines = install.strip().splitlines()
    assert lines[0] == "python3 -m venv .venv && . .venv/bin/activate"
    assert all(line.startswith("pip install") for line in lines[1:])
    assert "pip install -e '.[fastapi]'" in lines


@pytest.mark.server
def test_commands_run_as_written(tmp_path: Path) -> None:
    """The getting-started commands run as written, main.py left uncommitted."""
    app, route, client = blocks("python")
    port = str(free_port())
    (tmp_path / "main.py").write_text(app + "\n\n" + route)
    (tmp_path / "ws_client.py").write_text(client.replace("8000", port))
    _install, *commands = blocks("console")
    # start, drain with curl, rollback, a WebSocket and the CLI's drain, stop
    assert len(commands) == 5
    code, out = run_shell("".join(commands).replace("8000", port), tmp_path, clean_env())
    assert code == 0, out
    assert re.search(r"^ready$", out, re.MULTILINE), out  # ready --wait
    assert '{"accepted":true,"duplicate":false}' in out, out  # begin, with curl
    assert re.search(r'"status":"drain(ing|ed)"', out), out  # its status, with curl
    assert '"status":"rolled-back"' in out, out
    assert re.search(r"^drained\s+http=0 websocket=0 jobs=0 schedules=0", out, re.M), out
    assert "echoed hello" in out, out
    assert "closed 1012 draining" in out, out
    assert "serve.stopped drain=drained" in out, out
