"""`forgezero-lifecycle demo --short`: generations hand over, behind a router and on one port,
and nothing is lost."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.jobs.conftest import postgres_dsn

from .conftest import PROJECT_ROOT

pytestmark = pytest.mark.server


def test_short_demo_loses_nothing() -> None:
    """The report counts zero lost requests, sessions and jobs, and the exit code says so."""
    result = subprocess.run(
        [sys.executable, "-m", "forgezero_lifecycle", "demo", "--short"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    report = result.stdout
    assert result.returncode == 0, report + result.stderr
    assert "RESULT: nothing lost" in report
    lost = re.findall(r"^\s+lost\s+(\d+)$", report, flags=re.MULTILINE)
    assert lost == ["0", "0", "0"]  # HTTP requests, durable jobs, the same-port act
    assert re.search(r"dropped without notice\s+0", report)
    assert re.search(r"completed twice\s+0", report)
    assert re.search(r"stale commits rejected\s+1", report)
    assert re.search(r"State handoff\s+acknowledged by B: cursor visits-\d+", report)
    assert re.search(r"^\s+sha256:[0-9a-f]{64}$", report, flags=re.MULTILINE)
    assert re.search(r"Drain of A\s+drained in", report)
    # The same-port act: one port, no router, SIGHUP; nothing refused, two sets of workers.
    assert re.search(r"^\s+refused\s+0\s", report, flags=re.MULTILINE)
    workers = re.search(r"generation 1 \[(\d+), (\d+)\]  ->  generation 2 \[(\d+), (\d+)\]", report)
    assert workers is not None, report
    assert len(set(workers.groups())) == 4
    assert re.search(r"exit code 0$", report, flags=re.MULTILINE)
    assert "Traceback" not in result.stderr


@pytest.mark.postgres
def test_postgres_demo_loses_nothing() -> None:
    """The short demo on PostgreSQL loses nothing: `--postgres DSN` runs the same handover with the
    job store in PostgreSQL."""
    dsn = postgres_dsn()  # required in CI, a visible skip elsewhere
    result = subprocess.run(
        [sys.executable, "-m", "forgezero_lifecycle", "demo", "--short", "--postgres", dsn],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "enqueued (PostgreSQL)" in result.stdout
    assert "RESULT: nothing lost" in result.stdout
    assert dsn not in result.stdout + result.stderr
