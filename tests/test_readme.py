"""The README is a front door that works: short, its links lead somewhere, its Quick start runs.

The Quick start is run as written: its ``main.py`` in a git repository of its own, its commands in
one shell (a real ``forgezero-lifecycle serve`` on a free port, the CLI's drain, SIGTERM). What
the README moved into ``docs/`` is checked there (Getting started: the other servers, WebSockets,
the bounds of ``timeoutMs``).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import time
from importlib.metadata import requires
from pathlib import Path
from typing import Final

import psycopg
import pytest
from packaging.requirements import Requirement

from forgezero_lifecycle.wire.drain import MAX_DRAIN_TIMEOUT_MS, MIN_DRAIN_TIMEOUT_MS
from tests.cli.conftest import free_port
from tests.examples._shell import clean_env, run_shell

ROOT: Final = Path(__file__).resolve().parents[1]
README: Final = (ROOT / "README.md").read_text()
QUICK_START: Final = README[README.index("## Quick start") : README.index("## The guarantees")]
GETTING_STARTED: Final = (ROOT / "docs" / "getting-started.md").read_text()
LOCAL_DSN: Final = "postgresql://postgres@127.0.0.1:5432/test"
#: Pages the README links to that other branches add to docs/ (the site's nav lists them once
#: merged); every other link must lead to a file of the repository.
PAGES_ADDED_ELSEWHERE: Final = frozenset({"docs/servers.md"})


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


def test_at_most_200_lines() -> None:
    """The README is a front door of at most 200 lines."""
    assert len(README.splitlines()) <= 200


def test_two_commands_first() -> None:
    """The README names the two commands first."""
    first = blocks(README, "console")[0]
    assert re.search(r"^make demo\b", first, re.MULTILINE)
    assert re.search(r"^make test\b", first, re.MULTILINE)


def test_relative_links_resolve() -> None:
    """Every relative link of the README leads to a file."""
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README)
    assert len(links) > 10
    for link in links:
        if link not in PAGES_ADDED_ELSEWHERE:
            assert (ROOT / link).exists(), link


def test_quick_start_is_k8s_example() -> None:
    """One text: tests/ops/test_kubernetes.py runs examples/quickstart/main.py under serve."""
    (code,) = blocks(QUICK_START, "python")
    assert code == (ROOT / "examples" / "quickstart" / "main.py").read_text()


def test_one_install_line() -> None:
    """A venv, then pip install -e '.[EXTRA]': the library's requirements and the extra's cover
    main.py; the published form is named too."""
    (install, *_) = blocks(QUICK_START, "console")
    assert install.startswith("python3 -m venv .venv && . .venv/bin/activate\n")
    (extra,) = re.findall(r"^pip install -e '\.\[(\w+)\]'$", install, re.MULTILINE)
    assert f"pip install 'forgezero-lifecycle[{extra}]'" in QUICK_START
    brought = {"forgezero_lifecycle"}
    for line in requires("forgezero-lifecycle") or []:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
            brought.add(requirement.name.lower().replace("-", "_"))
    (code,) = blocks(QUICK_START, "python")
    imported = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert "fastapi" in imported
    missing = {name for name in imported if name not in sys.stdlib_module_names} - brought
    assert not missing, missing


def _git(cwd: Path, *commands: list[str]) -> None:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    for command in commands:
        subprocess.run([*git, *command], cwd=cwd, check=True, capture_output=True)


@pytest.mark.server
@pytest.mark.parametrize("committed", [True, False], ids=["committed", "uncommitted"])
def test_quick_start_runs(tmp_path: Path, committed: bool) -> None:
    """main.py in a git repository, committed or not, then the commands in one shell: serve,
    drain, SIGTERM; the revision is the commit once there is one."""
    _install, start, drain = blocks(QUICK_START, "console")
    (code,) = blocks(QUICK_START, "python")
    assert "forgezero-lifecycle serve main:app" in start
    (tmp_path / "main.py").write_text(code)
    _git(tmp_path, ["init", "-q"], ["add", "main.py"])
    if committed:
        _git(tmp_path, ["commit", "-q", "-m", "main"])
    port = str(free_port())
    script = (start + 'echo "revision=$FORGEZERO_REVISION"\n' + drain).replace("8000", port)
    code, out = run_shell(script, tmp_path, clean_env())
    assert code == 0, out
    # the CLI's result line, once (the progress line repeated it)
    assert len(re.findall(r"^drained\s+http=0", out, re.MULTILINE)) == 1, out
    assert "serve.stopped drain=drained" in out, out  # SIGTERM: serve exits after the drain
    (revision,) = re.findall(r"^revision=([0-9a-f]{40})$", out, re.MULTILINE)
    if committed:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True, check=True
        )
        assert revision == head.stdout.strip()


@pytest.mark.server
def test_quick_start_wait_gives_up(tmp_path: Path) -> None:
    """serve exits (no main.py here): the start commands end within their 10 s wait, exit 4,
    and say why, instead of waiting forever."""
    _install, start, _drain = blocks(QUICK_START, "console")
    started = time.monotonic()
    code, out = run_shell(start.replace("8000", str(free_port())), tmp_path, clean_env())
    assert code == 4, out
    assert "not ready after 10s" in out, out
    assert "RUNTIME_UNREACHABLE" in out, out
    assert time.monotonic() - started < 60  # 10 s of waiting, on a loaded machine


def test_guide_shows_servers() -> None:
    """Not only serve: uvicorn too; and uvicorn without websockets/wsproto never hands one over."""
    assert "forgezero-lifecycle serve main:app" in GETTING_STARTED
    assert "uvicorn main:app" in GETTING_STARTED
    assert "pip install websockets" in GETTING_STARTED


def test_guide_timeout_bounds() -> None:
    """timeoutMs outside 100-600000 is refused; the newcomer reads the bounds first."""
    assert f"from {MIN_DRAIN_TIMEOUT_MS} to {MAX_DRAIN_TIMEOUT_MS}" in GETTING_STARTED


def test_one_revision_variable() -> None:
    """FORGEZERO_REVISION, the name serve exports, in the README, the docs and every example."""
    assert 'os.environ["FORGEZERO_REVISION"]' in QUICK_START
    texts = {"README.md": README}
    for path in [
        *ROOT.glob("docs/**/*.md"),
        *ROOT.glob("examples/**/*.md"),
        *ROOT.glob("examples/**/*.py"),
        *ROOT.glob("examples/**/*.yaml"),
        ROOT / "examples/run.sh",
    ]:
        texts[str(path.relative_to(ROOT))] = path.read_text()
    for name, text in texts.items():
        assert re.search(r"\$\{?REVISION\b|environ\[\"REVISION\"\]|\$REV\b", text) is None, name


def _local_postgres_answers() -> bool:
    try:
        psycopg.connect(LOCAL_DSN, connect_timeout=3).close()
    except psycopg.Error:
        return False
    return True


def test_make_test_local_postgres() -> None:
    """Unset FORGEZERO_TEST_POSTGRES_DSN: the local server when it answers, else none (skip)."""
    env = {k: v for k, v in os.environ.items() if k != "FORGEZERO_TEST_POSTGRES_DSN"}
    env.pop("MAKEFLAGS", None)
    shown = subprocess.run(
        ["make", "-s", "test-postgres-dsn"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == (LOCAL_DSN if _local_postgres_answers() else "")
    given = subprocess.run(
        ["make", "-s", "test-postgres-dsn"],
        cwd=ROOT,
        env={**env, "FORGEZERO_TEST_POSTGRES_DSN": "postgresql://u@127.0.0.1:1/given"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert given.stdout.strip() == "postgresql://u@127.0.0.1:1/given"
