"""The recycling, watchdog and preload flags of ``serve`` (one argument group), and their checks:
bad values are usage errors, and the flags need ``--workers`` (a supervisor replaces the worker,
or forks it from the preload process)."""

from __future__ import annotations

import argparse

import pytest

from forgezero_lifecycle._errors import ConfigurationError
from forgezero_lifecycle.serve.options import ServeOptions, add_arguments, options_from_args

FLAGS = (
    "--max-requests",
    "--max-requests-jitter",
    "--max-worker-memory",
    "--max-worker-lifetime",
    "--worker-timeout",
    "--preload",
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    return parser


def test_flags_form_one_group() -> None:
    """The six flags are the 'worker recycling and health' group, and only they."""
    (group,) = [g for g in _parser()._action_groups if g.title == "worker recycling and health"]
    assert tuple(action.option_strings[0] for action in group._group_actions) == FLAGS


def test_flags_reach_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each flag lands in its ``ServeOptions`` field, durations in seconds."""
    monkeypatch.setenv("FORGEZERO_CONTROL_TOKEN", "a-control-token-0123456789abcdef")
    args = _parser().parse_args(
        [
            "m:app", "--workers", "2", "--max-requests", "400", "--max-requests-jitter", "100",
            "--max-worker-memory", "512", "--max-worker-lifetime", "10m",
            "--worker-timeout", "2s", "--preload",
        ]
    )  # fmt: skip
    args.token_file = None  # the CLI's own flag (forgezero_lifecycle.cli)
    options = options_from_args(args)
    assert (options.max_requests, options.max_requests_jitter) == (400, 100)
    assert (options.max_worker_memory, options.max_worker_lifetime) == (512, 600.0)
    assert options.worker_timeout == 2.0
    assert options.preload is True


@pytest.mark.parametrize(
    "argv",
    [
        ["--max-requests", "0"],
        ["--max-requests", "-1"],
        ["--max-requests-jitter", "x"],
        ["--max-worker-memory", "0"],
        ["--max-worker-lifetime", "10ms"],
        ["--worker-timeout", "soon"],
    ],
)
def test_bad_values_are_usage_errors(argv: list[str]) -> None:
    """A value out of range is refused when the flags are read, naming the flag."""
    with pytest.raises(argparse.ArgumentError, match=argv[0]):
        _parser().parse_args(["m:app", "--workers", "2", *argv])


def test_flags_need_workers() -> None:
    """Without ``--workers`` there is no supervisor to replace a worker: a configuration error
    naming the flags."""
    with pytest.raises(ConfigurationError, match="--max-requests, --worker-timeout need --workers"):
        ServeOptions(max_requests=10, worker_timeout=2.0)
    assert ServeOptions(workers=1, max_requests=10).max_requests == 10


def test_preload_needs_workers() -> None:
    """``--preload`` forks a supervisor's workers: without ``--workers`` a configuration error."""
    with pytest.raises(ConfigurationError, match="--preload needs --workers N"):
        ServeOptions(preload=True)
    assert ServeOptions(workers=1, preload=True).preload is True
    assert ServeOptions(workers=1).preload is False


def test_preload_without_pidfds_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel offers no pidfds (faked here: this machine has them), ``--preload`` is a
    configuration error at start-up that says what it needs."""
    monkeypatch.delattr("os.pidfd_open")
    with pytest.raises(ConfigurationError, match="--preload needs Linux"):
        ServeOptions(workers=2, preload=True)
