"""docs/jobs.md's quick start runs as written: its apps and its commands, SQLite then PostgreSQL.

Each app (examples/jobs/app.py, examples/jobs/app_postgres.py, which the page shows as they
are: tests/test_docs.py) is saved under the name the page gives it, and the page's commands run
in one shell: a real ``forgezero-lifecycle serve`` on a free port, the orders posted twice (one
job), the receipt written by the job's handler, SIGTERM drained to exit 0. Substituted: the port,
the ``pip install`` line (the test environment has the extras), the PostgreSQL DSN (a database
of the test's own) and the page's ``sleep 1`` (a bounded wait for the receipt instead: no
timing assumption).
"""

from __future__ import annotations

import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.cli.conftest import free_port
from tests.jobs.conftest import postgres_dsn

from ._shell import clean_env, run_shell

ROOT: Final = Path(__file__).resolve().parents[2]
PAGE: Final = (ROOT / "docs" / "jobs.md").read_text()


def section(title: str) -> str:
    start = PAGE.index(f"## {title}")
    return PAGE[start : PAGE.index("\n## ", start + 1)]


def console(text: str) -> list[str]:
    return re.findall(r"^```console\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


def included(text: str) -> list[str]:
    return re.findall(r"^<!-- copy of (examples/jobs/[\w.]+):", text, re.MULTILINE)


def run_commands(tmp_path: Path, commands: str, env: dict[str, str]) -> tuple[int, str]:
    port = str(free_port())
    receipt = f"until curl -s 127.0.0.1:{port}/receipts | grep -q o-1; do sleep 0.2; done"
    lines = [
        receipt if line.startswith("sleep 1") else line.replace("8000", port)
        for line in commands.splitlines()
        if not line.startswith("pip install")
    ]
    return run_shell("\n".join(lines) + "\n", tmp_path, env)


def assert_ran(code: int, out: str) -> None:
    assert code == 0, out
    assert out.count('{"job":1}') == 2, out  # posted twice: one job
    assert '["o-1"]' in out, out  # the handler's receipt, committed with the job
    assert "serve.stopped drain=drained" in out, out


@pytest.mark.server
def test_sqlite_quick_start(tmp_path: Path) -> None:
    """The SQLite quick start runs as written."""
    text = section("Quick start on SQLite")
    assert "Save it as `jobs_app.py`" in text
    assert included(text) == ["examples/jobs/app.py"]
    shutil.copy(ROOT / "examples" / "jobs" / "app.py", tmp_path / "jobs_app.py")
    (commands,) = console(text)
    assert "forgezero-lifecycle serve jobs_app:app" in commands
    assert_ran(*run_commands(tmp_path, commands, clean_env()))
    assert (tmp_path / "jobs.sqlite3").exists()


@pytest.fixture
def database() -> Iterator[str]:
    """A database of this test's own (the page's receipts table is in its default schema)."""
    dsn = postgres_dsn()
    name = f"fz_jobs_quickstart_{secrets.token_hex(6)}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield make_conninfo(dsn, dbname=name)
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.mark.postgres
@pytest.mark.server
def test_postgres_quick_start(tmp_path: Path, database: str) -> None:
    """The PostgreSQL block's export and serve lines, then "the same curl commands"."""
    text = section("Then on PostgreSQL")
    assert "Save it as `jobs_app_postgres.py`" in text
    assert included(text) == ["examples/jobs/app_postgres.py"]
    shutil.copy(ROOT / "examples" / "jobs" / "app_postgres.py", tmp_path / "jobs_app_postgres.py")
    (setup,) = console(text)
    export, serve = setup.strip().splitlines()
    assert export.startswith("export JOBS_DSN=postgresql://")
    (sqlite_commands,) = console(section("Quick start on SQLite"))
    assert serve == next(
        line.replace("jobs_app:app", "jobs_app_postgres:app")
        for line in sqlite_commands.splitlines()
        if line.startswith("forgezero-lifecycle serve")
    )
    commands = sqlite_commands.replace("jobs_app:app", "jobs_app_postgres:app")
    env = clean_env()
    commands = f"export JOBS_DSN='{database}'\n" + commands
    assert_ran(*run_commands(tmp_path, commands, env))
    with psycopg.connect(database) as conn:
        assert conn.execute("SELECT order_id FROM receipts").fetchall() == [("o-1",)]
