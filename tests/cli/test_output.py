"""What the CLI prints: the live progress line, the summary, `--help` and small parsers."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys

import pytest

from forgezero_lifecycle import __version__
from forgezero_lifecycle.cli.commands import export_url
from forgezero_lifecycle.cli.main import build_parser
from forgezero_lifecycle.cli.output import (
    EXIT_FAILED,
    Progress,
    handover_summary,
    report,
    summary,
)
from forgezero_lifecycle.serve import parse_duration
from forgezero_lifecycle.wire.drain import DrainStatus
from forgezero_lifecycle.wire.supervisor import HandoverStatus

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


def test_terminal_one_live_line() -> None:
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


def test_pipe_line_per_change() -> None:
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


def test_summary_names_failure() -> None:
    """The summary line names the failure code."""
    line = summary({**STATUS, "status": "failed", "failure": "RUNTIME_DRAIN_TIMEOUT"})
    assert line.startswith("failed  failure=RUNTIME_DRAIN_TIMEOUT  http=2")
    assert line.endswith("nonce=" + "n" * 43)


def test_handover_summary_names_the_failure() -> None:
    """An aborted handover's line gives its stable code, then the words; one that is done, its
    time alone."""
    aborted = HandoverStatus(
        handover=2,
        state="aborted",
        from_generation=1,
        to_generation=2,
        failure="RUNTIME_HANDOVER_NOT_PROVED",
        detail="generation 2 did not prove it serves: worker 1 did not answer",
        seconds=10.04,
    )
    assert handover_summary(aborted) == (
        "handover 2 aborted: generation 1 -> 2 in 10.0s; RUNTIME_HANDOVER_NOT_PROVED: "
        "generation 2 did not prove it serves: worker 1 did not answer"
    )
    done = HandoverStatus(handover=3, state="done", from_generation=1, to_generation=3, seconds=2)
    assert handover_summary(done) == "handover 3 done: generation 1 -> 3 in 2.0s"


def test_shared_listener_advice(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A drain that reached one worker of several says so, and what to run, in the normal
    output (not only under --json)."""
    advice = "a drain reaches only this worker; run `forgezero-lifecycle serve APP --workers N`"
    status = {
        **STATUS,
        "status": "failed",
        "failure": "RUNTIME_DRAIN_FAILED",
        "detail": {"sharedListener": {"siblingPids": [41, 42], "advice": advice}},
    }
    args = argparse.Namespace(command="drain", json=False, no_wait=False)
    assert report(args, status) == EXIT_FAILED
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("failed  failure=RUNTIME_DRAIN_FAILED")
    assert (
        lines[1] == f"sharedListener: sibling workers 41, 42 share this worker's socket; {advice}"
    )


def test_no_advice_without_siblings(capsys: pytest.CaptureFixture[str]) -> None:
    """A status without ``detail.sharedListener`` prints its one line only."""
    args = argparse.Namespace(command="status", json=False, no_wait=False)
    report(args, {**STATUS, "status": "drained"})
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_export_url_completed() -> None:
    """A base URL gets the export path, both revisions and the import check left to the new
    generation (which validates the value itself); a full URL is kept."""
    assert export_url("http://127.0.0.1:8000", REVISION_A, REVISION_B) == (
        "http://127.0.0.1:8000/.forgezero/runtime/state/v1/export"
        f"?sourceRevision={REVISION_A}&targetRevision={REVISION_B}&importCheck=importer"
    )
    full = "http://[::1]:8000/custom/export?sourceRevision=x&targetRevision=y"
    assert export_url(full, REVISION_A, REVISION_B) == full


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30.0), ("500ms", 0.5), ("2m", 120.0), ("1.5", 1.5)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_bad_duration_refused() -> None:
    """A bad duration is a usage error."""
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration("soon")


def test_help_lists_exit_codes() -> None:
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
        "4  gave up waiting",
    ):
        assert code in result.stdout
    assert "FORGEZERO_CONTROL_TOKEN" in result.stdout


@pytest.mark.parametrize(
    ("settled", "terminal"), [(s, t) for s in ("drained", "failed") for t in (False, True)]
)
def test_settled_status_printed_once(settled: str, terminal: bool) -> None:
    """The settled status is not a progress line: report() prints it, once (it was printed by
    both, one after the other)."""
    stream = _Terminal() if terminal else io.StringIO()
    progress = Progress(stream, deadline=30)
    progress.drain(DrainStatus.model_validate(STATUS))
    progress.drain(DrainStatus.model_validate({**STATUS, "status": settled}))
    progress.close()
    assert settled not in stream.getvalue()
    assert "draining" in stream.getvalue()


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    (commands,) = (
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    return dict(commands.choices)


def test_every_flag_has_help() -> None:
    """Every flag of every subcommand says what it is in --help (the hidden --retries aside)."""
    missing = [
        f"{name} {action.option_strings or action.dest}"
        for name, parser in _subcommands().items()
        for action in parser._actions
        if not action.help
    ]
    assert not missing, missing


def test_epilogues_per_subcommand() -> None:
    """Each subcommand's --help lists its own exit codes and environment, not another's."""
    parsers = _subcommands()
    epilogs = {name: parser.epilog or "" for name, parser in parsers.items()}
    assert len(set(epilogs.values())) == len(epilogs)  # no epilogue repeated
    assert "FORGEZERO_CONTROL_TOKEN" not in epilogs["ready"]
    assert "4  not ready within --wait" in epilogs["ready"]
    assert "rolled back" in epilogs["rollback"]
    assert "  4" not in epilogs["rollback"]
    assert "FORGEZERO_HANDOFF_TOKEN" in epilogs["handoff"]
    assert "FORGEZERO_HANDOFF_TOKEN" not in epilogs["drain"]
    for grace in ("FORGEZERO_NOT_READY_GRACE", "FORGEZERO_STREAM_GRACE"):
        assert grace in epilogs["serve"]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    """`forgezero-lifecycle --version` prints the installed version."""
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"forgezero-lifecycle {__version__}\n"


BLOCKED = {
    **STATUS,
    "detail": {
        "oldestInFlight": [
            {"kind": "http", "method": "GET", "route": "/items/{item_id}", "ageMs": 12_340},
            {"kind": "websocket", "method": None, "route": "/live/{room}", "ageMs": 9_000},
            {"kind": "http", "method": "POST", "route": None, "ageMs": 500},
        ]
    },
}


def test_summary_names_what_blocks_the_drain() -> None:
    """The status line names the oldest running requests: method or kind, template, age."""
    line = summary(BLOCKED)
    assert line.endswith(
        "oldest: GET /items/{item_id} 12.3s, websocket /live/{room} 9.0s, "
        "POST (no route template) 0.5s"
    )


def test_progress_names_what_blocks_the_drain() -> None:
    """Each progress line of a drain names what it still waits for."""
    stream = io.StringIO()
    Progress(stream, deadline=30).drain(DrainStatus.model_validate(BLOCKED))
    assert "oldest: GET /items/{item_id} 12.3s" in stream.getvalue()
