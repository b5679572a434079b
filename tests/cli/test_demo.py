"""`forgezero-lifecycle demo --short`: generations hand over, behind a router and on one port,
and nothing is lost."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from typing import Final

import pytest

from tests.jobs.conftest import postgres_dsn

from .conftest import PROJECT_ROOT

#: How long a short demo may take on a loaded machine (35 s when the suite runs in parallel).
BOUND: Final = 100

pytestmark = [pytest.mark.server, pytest.mark.timeout(BOUND + 30)]


def _demo(*flags: str) -> subprocess.CompletedProcess[str]:
    """Run the demo in a session of its own; past :data:`BOUND`, or when the test is stopped,
    the whole session is killed, servers and workers included (killing the demo alone left
    its `serve` processes running)."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "forgezero_lifecycle", "demo", *flags],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = demo.communicate(timeout=BOUND)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(demo.pid, signal.SIGKILL)  # anything the demo left behind
        demo.wait()
    return subprocess.CompletedProcess(demo.args, demo.returncode, out, err)


def test_short_demo_loses_nothing() -> None:
    """The report counts zero lost requests, sessions and jobs, and the exit code says so."""
    result = _demo("--short")
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
    result = _demo("--short", "--postgres", dsn)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "enqueued (PostgreSQL)" in result.stdout
    assert "RESULT: nothing lost" in result.stdout
    assert dsn not in result.stdout + result.stderr
