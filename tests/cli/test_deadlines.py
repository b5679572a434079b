"""A drain's deadline as flags give it: 100ms to 10m, refused when read, the same for ``serve
--drain-timeout`` and the CLI's ``--timeout``."""

from __future__ import annotations

import pytest

from forgezero_lifecycle._errors import ConfigurationError
from forgezero_lifecycle.serve import ServeOptions, parse_duration

from ._run import Result, run
from .conftest import CONTROL_TOKEN, REVISION_A, REVISION_B


def test_an_hour_is_a_duration() -> None:
    assert parse_duration("1h") == 3600.0


@pytest.mark.parametrize(
    ("flag", "problem"),
    [("0s", "too short"), ("50ms", "too short"), ("20m", "too long"), ("1h", "too long")],
)
def test_serve_refuses_bad_timeout(
    capsys: pytest.CaptureFixture[str], flag: str, problem: str
) -> None:
    """serve refuses a drain timeout out of range before it starts: a usage error (exit 2) naming
    the problem; nothing is bound or imported."""
    result = run(capsys, "serve", "tests.serve.plain_app:app", "--drain-timeout", flag)
    assert result.code == 2
    assert problem in result.err, result.err


def drain(capsys: pytest.CaptureFixture[str], timeout: str) -> Result:
    """``drain --timeout TIMEOUT`` against a port nobody listens on."""
    return run(
        capsys,
        "drain",
        "--url",
        "http://127.0.0.1:9",
        "--source-revision",
        REVISION_A,
        "--target-revision",
        REVISION_B,
        "--timeout",
        timeout,
    )


@pytest.mark.parametrize("flag", ["100ms", "30s", "10m"])
def test_bounds_are_deadlines(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flag: str
) -> None:
    """The bounds themselves are deadlines: the CLI's ``--timeout`` takes what ``serve`` takes
    (checked without a server: the command then cannot connect, exit 3, not a usage error)."""
    monkeypatch.setenv("FORGEZERO_CONTROL_TOKEN", CONTROL_TOKEN)
    result = drain(capsys, flag)
    assert result.code == 3, result.err
    assert "too " not in result.err


@pytest.mark.parametrize("seconds", [0.0, 0.05, 1200.0])
def test_serve_options_refuse_too(seconds: float) -> None:
    """ServeOptions built in code refuse the same drain timeouts."""
    with pytest.raises(ConfigurationError, match="drain_timeout"):
        ServeOptions(drain_timeout=seconds)
