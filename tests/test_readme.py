"""What a newcomer needs is on the README's first screen, and the commands agree with the code."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import psycopg

from forgezero_lifecycle.wire.drain import MAX_DRAIN_TIMEOUT_MS, MIN_DRAIN_TIMEOUT_MS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
QUICK_START = README[README.index("## Quick start") : README.index("## The guarantees")]
LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def test_the_quick_start_shows_the_command_that_starts_the_app() -> None:
    """Not only the code: how to run it, under serve or uvicorn."""
    assert "forgezero-lifecycle serve main:app" in QUICK_START
    assert "uvicorn main:app" in QUICK_START


def test_the_quick_start_says_websockets_need_a_library_under_uvicorn() -> None:
    """uvicorn without websockets/wsproto never hands a WebSocket to the app."""
    assert "pip install websockets" in QUICK_START


def test_the_quick_start_gives_the_timeout_bounds_the_wire_enforces() -> None:
    """timeoutMs outside 100-600000 is refused; the newcomer reads the bounds first."""
    assert f"from {MIN_DRAIN_TIMEOUT_MS} to {MAX_DRAIN_TIMEOUT_MS}" in QUICK_START


def test_one_name_for_the_revision_variable_everywhere() -> None:
    """FORGEZERO_REVISION, the name serve exports, in the README and every example."""
    assert 'os.environ["FORGEZERO_REVISION"]' in QUICK_START
    texts = {"README.md": README}
    for path in [
        *ROOT.glob("examples/**/*.md"),
        *ROOT.glob("examples/**/*.py"),
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


def test_make_test_uses_the_local_postgres_when_one_answers() -> None:
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
