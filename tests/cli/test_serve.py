"""`forgezero-lifecycle serve` under real signals: SIGTERM drains, then the process exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ._run import run
from .conftest import CONTROL_TOKEN, PROJECT_ROOT, REVISION_A, REVISION_B, StartServe

pytestmark = pytest.mark.server

REFUSAL = {"error": "RUNTIME_DRAINING"}


def test_sigterm_drains_exits_0(start_serve: StartServe) -> None:
    """The slow request admitted before SIGTERM completes; new ones get 503; exit code 0."""
    served = start_serve("tests.cli.apps:app", "--drain-timeout", "10s")
    slow = served.in_background("/held")  # in flight until released below
    served.wait_admitted()
    served.signal(signal.SIGTERM)
    served.wait_for(lambda: served.get("/.forgezero/runtime/ready").status_code == 503, "not ready")
    refused = served.get("/fast")
    assert refused.status_code == 503
    assert refused.json() == REFUSAL
    assert refused.headers["connection"] == "close"
    served.get("/_test/release")
    assert served.wait_exit() == 0
    served.join()
    assert isinstance(slow[0], httpx.Response)
    assert slow[0].status_code == 200
    log = served.log()
    assert "serve.drain_settled state=drained" in log
    assert CONTROL_TOKEN not in log


def test_failed_self_drain_exits_1(start_serve: StartServe) -> None:
    """A drain that misses its deadline makes the process exit non-zero."""
    served = start_serve("tests.cli.apps:app", "--drain-timeout", "300ms")
    served.in_background("/slow?seconds=1.5")
    served.wait_admitted()
    served.signal(signal.SIGTERM)
    assert served.wait_exit() == 1
    assert "state=failed" in served.log()


def test_second_signal_stops_at_once(start_serve: StartServe) -> None:
    """While a long request holds the drain, a second signal forces the stop (exit 1)."""
    served = start_serve("tests.cli.apps:app", "--drain-timeout", "30s")
    served.in_background("/slow?seconds=30")
    served.wait_admitted()
    served.signal(signal.SIGTERM)
    served.wait_for(lambda: served.get("/.forgezero/runtime/ready").status_code == 503, "not ready")
    served.signal(signal.SIGINT)
    assert served.wait_exit(10.0) == 1
    assert "serve.forced" in served.log()


def test_sigterm_after_prestop(
    start_serve: StartServe, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preStop variant: the CLI drained already, so SIGTERM follows that drain and exits."""
    monkeypatch.setenv("FORGEZERO_CONTROL_TOKEN", CONTROL_TOKEN)
    served = start_serve("tests.cli.apps:app", "--drain-timeout", "10s")
    revisions = ("--source-revision", REVISION_A, "--target-revision", REVISION_B)
    assert run(capsys, "drain", "--url", served.url, *revisions).code == 0
    served.signal(signal.SIGTERM)
    assert served.wait_exit() == 0
    assert "a drain was already begun" in served.log()


def test_plain_app_gets_runtime(
    start_serve: StartServe, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An app without a runtime is wrapped: probes, not-ready grace and self-drain all work."""
    monkeypatch.setenv("FORGEZERO_CONTROL_TOKEN", CONTROL_TOKEN)
    served = start_serve("tests.cli.apps:plain", "--not-ready-grace", "2s")
    assert served.get("/").text == "plain"
    assert run(capsys, "ready", "--url", served.url).code == 0
    slow = served.in_background("/slow")
    served.signal(signal.SIGTERM)
    served.wait_for(lambda: served.get("/.forgezero/runtime/ready").status_code == 503, "not ready")
    assert served.get("/").status_code == 200  # the grace: not ready, but still admitting
    assert served.wait_exit() == 0
    served.join()
    assert isinstance(slow[0], httpx.Response)
    assert slow[0].status_code == 200


def test_unimportable_app_reported() -> None:
    """A wrong APP is one line on stderr and exit code 2, not a traceback."""
    result = subprocess.run(
        [sys.executable, "-m", "forgezero_lifecycle", "serve", "no_such_module:app"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "cannot import the app" in result.stderr
    assert "Traceback" not in result.stderr


def _serve_once(*argv: str) -> subprocess.CompletedProcess[str]:
    """``serve`` that is expected to refuse to start (bounded)."""
    return subprocess.run(
        [sys.executable, "-m", "forgezero_lifecycle", "serve", *argv],
        cwd=PROJECT_ROOT,
        env={**os.environ, "FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_import_error_shown() -> None:
    """An app whose import raises shows the real error: the exception type and the app's own
    traceback, not just the exception's text."""
    result = _serve_once("tests.cli.broken_app:app")
    assert result.returncode == 2
    assert "raised KeyError: 'FORGEZERO_TESTS_SETTING_NOBODY_SETS'" in result.stderr
    assert "tests/cli/broken_app.py" in result.stderr  # where it failed


def test_ignored_flag_refused() -> None:
    """--not-ready-grace differs from the runtime the app built itself: an error, not ignored."""
    result = _serve_once("tests.cli.apps:fixed", "--not-ready-grace", "2s", "--stream-grace", "5s")
    assert result.returncode == 2
    assert "--not-ready-grace 2.0 (the runtime has 0.0)" in result.stderr
    assert "--stream-grace" not in result.stderr  # it agrees with the runtime's 5 s


def test_log_names_runtime(start_serve: StartServe) -> None:
    """The log says which runtime is served: the app's own runtime and one serve built are told
    apart (it used to say 'own' for both)."""
    own = start_serve("tests.cli.apps:app", "--not-ready-grace", "1s")  # read by the app
    built = start_serve("tests.cli.apps:plain")
    own.wait_for(lambda: "serve.runtime" in own.log(), "logged")
    built.wait_for(lambda: "serve.runtime" in built.log(), "logged")
    assert "serve.runtime source=app" in own.log()
    assert "serve.runtime source=serve" in built.log()


def test_follow_honours_timeout(
    start_serve: StartServe, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A preStop drain with a long deadline: SIGTERM waits at most --drain-timeout, then exits 1."""
    monkeypatch.setenv("FORGEZERO_CONTROL_TOKEN", CONTROL_TOKEN)
    served = start_serve("tests.cli.apps:app", "--drain-timeout", "1s")
    served.in_background("/slow?seconds=30")
    served.wait_admitted()
    revisions = ("--source-revision", REVISION_A, "--target-revision", REVISION_B)
    begun = run(capsys, "drain", "--url", served.url, *revisions, "--timeout", "60s", "--no-wait")
    assert begun.code == 0
    served.signal(signal.SIGTERM)
    assert served.wait_exit() == 1
    assert "serve.follow_timeout" in served.log()


def test_serve_token_file_rules(
    tmp_path: Path,
) -> None:
    """serve reads a token file by the same rules as the other commands: a token file of two lines
    is named as such, never echoed, and nothing starts."""
    token_file = tmp_path / "token"
    token_file.write_text(CONTROL_TOKEN + "\nsecond-line\n")
    token_file.chmod(0o600)
    result = _serve_once("tests.cli.apps:plain", "--token-file", str(token_file))
    assert result.returncode == 2
    assert "holds more than one line" in result.stderr
    assert CONTROL_TOKEN not in result.stderr


def test_serve_revision_from_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FORGEZERO_REVISION (e.g. the downward API) is the revision; --revision wins; bad is usage."""
    from forgezero_lifecycle._errors import ConfigurationError
    from forgezero_lifecycle.cli.main import build_parser
    from forgezero_lifecycle.serve import options_from_args

    parser = build_parser()
    monkeypatch.setenv("FORGEZERO_REVISION", REVISION_A)
    assert options_from_args(parser.parse_args(["serve", "m:app"])).revision == REVISION_A
    flagged = parser.parse_args(["serve", "m:app", "--revision", REVISION_B])
    assert options_from_args(flagged).revision == REVISION_B
    monkeypatch.setenv("FORGEZERO_REVISION", "v1.4.2")
    with pytest.raises(ConfigurationError, match="FORGEZERO_REVISION is not a revision"):
        options_from_args(parser.parse_args(["serve", "m:app"]))
    monkeypatch.delenv("FORGEZERO_REVISION")
    assert options_from_args(parser.parse_args(["serve", "m:app"])).revision is None


def test_sighup_single_process(
    start_serve: StartServe,
) -> None:
    """SIGHUP cannot hand one process over to itself: the request in flight completes, the
    process keeps serving, and the log says to run ``serve --workers N``."""
    served = start_serve("tests.cli.apps:app", "--drain-timeout", "10s")
    slow = served.in_background("/slow?seconds=1.5")
    served.wait_admitted()
    served.signal(signal.SIGHUP)
    served.join()
    assert isinstance(slow[0], httpx.Response)
    assert slow[0].status_code == 200
    assert served.get("/fast").status_code == 200
    assert "serve.sighup_ignored" in served.log()
    assert "serve APP --workers N" in served.log()
    served.signal(signal.SIGTERM)
    assert served.wait_exit() == 0
