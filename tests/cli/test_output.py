"""What the CLI prints: the live progress line, the summary, `--help` and small parsers."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys

import pytest

from forgezero_lifecycle.cli.commands import export_url
from forgezero_lifecycle.cli.output import Progress, summary
from forgezero_lifecycle.serve import parse_duration
from forgezero_lifecycle.wire.drain import DrainStatus

from .conftest import PROJECT_ROOT, REVISION_A, REVISION_B

STATUS = {
    "protocol": "forgezero-drain/v1",
    "nonce": "n" * 43,
    "sourceRevision": REVISION_A,
    "targetRevision": REVISION_B,
    "timeoutMs": 30000,
    "status": "draining",
    "inFlight": {"http": 2, "websocket": 1, "jobs": 3, "schedules": 0},
}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_one_live_line() -> None:
    """On a TTY every update rewrites the same line; close() ends it."""
    terminal = _Terminal()
    progress = Progress(terminal, deadline=30)
    status = DrainStatus.model_validate(STATUS)
    progress.drain(status)
    progress.drain(status)
    progress.close()
    text = terminal.getvalue()
    assert text.count("\r\x1b[2K") == 2
    assert text.count("\n") == 1
    assert "draining  http=2 websocket=1 jobs=3 schedules=0" in text
    assert "/ 30s" in text


def test_a_pipe_gets_a_line_per_change() -> None:
    """Without a TTY, repeated identical statuses print once."""
    pipe = io.StringIO()
    progress = Progress(pipe, deadline=30)
    status = DrainStatus.model_validate(STATUS)
    progress.drain(status)
    progress.drain(status)
    progress.drain(
        DrainStatus.model_validate({**STATUS, "inFlight": {**STATUS["inFlight"], "http": 1}})
    )
    progress.close()
    assert pipe.getvalue().count("\n") == 2
    assert "\r" not in pipe.getvalue()


def test_summary_names_the_failure_code() -> None:
    line = summary({**STATUS, "status": "failed", "failure": "RUNTIME_DRAIN_TIMEOUT"})
    assert line.startswith("failed  failure=RUNTIME_DRAIN_TIMEOUT  http=2")
    assert line.endswith("nonce=" + "n" * 43)


def test_export_url_completes_a_base_url() -> None:
    """A base URL gets the export path and both revisions; a full URL is kept."""
    assert export_url("http://127.0.0.1:8000", REVISION_A, REVISION_B) == (
        "http://127.0.0.1:8000/.forgezero/runtime/state/v1/export"
        f"?sourceRevision={REVISION_A}&targetRevision={REVISION_B}"
    )
    full = "http://[::1]:8000/custom/export?sourceRevision=x&targetRevision=y"
    assert export_url(full, REVISION_A, REVISION_B) == full


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30.0), ("500ms", 0.5), ("2m", 120.0), ("1.5", 1.5)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_bad_duration_is_a_usage_error() -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration("soon")


def test_help_documents_the_exit_codes() -> None:
    """`python -m forgezero_lifecycle --help` lists every exit code."""
    result = subprocess.run(
        [sys.executable, "-m", "forgezero_lifecycle", "drain", "--help"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    for code in (
        "0  drained",
        "1  failed",
        "2  usage",
        "3  control plane unreachable",
        "4  not settled",
    ):
        assert code in result.stdout
    assert "FORGEZERO_CONTROL_TOKEN" in result.stdout
