"""What a worker of ``serve --workers`` passes to the processes its app starts: no listening
socket, no channel to the supervisor, no blocked signal (real processes: the app starts a
``sleep`` through a shell and one through ``subprocess.Popen`` as it is imported,
tests/serve/helper_app.py).

Single ``serve``, uvicorn and gunicorn pass none of these (their descriptors are close-on-exec,
their signal mask is empty when the app is imported); a worker used to pass all three: the
port stayed in LISTEN, held by the ``sleep``, after ``serve`` exited 0, and a helper started at
import survived SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import StartSupervised

pytestmark = pytest.mark.server


@pytest.fixture
def helpers(tmp_path: Path) -> Iterator[Path]:
    """The file helper_app.py writes its helpers' PIDs to; every helper is killed at the end."""
    path = tmp_path / "helpers"
    try:
        yield path
    finally:
        for pid in _helpers(path).values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _helpers(path: Path) -> dict[str, int]:
    if not path.exists():
        return {}
    return {
        kind: int(pid)
        for kind, pid in (line.split() for line in path.read_text().split("\n") if line)
    }


def _sockets(pid: int) -> list[str]:
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:"):
                found.append(f"{fd} -> {target}")
    return found


def _signal_set(pid: int, field: str) -> set[signal.Signals]:
    """The signals in ``SigBlk`` / ``SigIgn`` of /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            mask = int(line.split()[1], 16)
            return {s for s in (signal.SIGTERM, signal.SIGINT) if mask & (1 << (s - 1))}
    raise AssertionError(f"no {field} for {pid}")


def test_helpers_inherit_no_socket_and_no_blocked_signal(
    start_supervised: StartSupervised, helpers: Path
) -> None:
    served = start_supervised(
        workers=1, target="tests.serve.helper_app:app", env={"FZW_HELPERS": str(helpers)}
    )
    started = served.wait_for(lambda: len(_helpers(helpers)) == 2 and _helpers(helpers), "helpers")
    shell, popen = started["shell"], started["popen"]
    assert _sockets(shell) == [], served.log()  # neither the listener nor the channel
    assert _signal_set(popen, "SigBlk") == set()
    assert _signal_set(popen, "SigIgn") == set()
    served.signal(signal.SIGTERM)
    assert served.wait_exit() == 0, served.log()
    port = int(served.url.rsplit(":", 1)[1])
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 2):
        pass  # the port is free once serve is gone (before: in LISTEN, held by the sleep)
