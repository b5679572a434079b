"""``serve --workers N --preload``: each generation imports its app once, in a preload process,
and forks its workers from it; real supervisors, real processes.

What a forked worker does once it runs (serving, recycling, the watchdog, the stop) is what a
spawned one does, and the recycling and watchdog tests run under ``--preload`` too
(tests/serve/test_recycling.py). These tests pin what is the preload's own: one import per
generation, a new import at every SIGHUP, an import that fails, and a preload process that dies.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Final

import pytest

from .conftest import StartSupervised, Supervised, alive, preloads

pytestmark = [pytest.mark.server]

PRELOAD_MODULE: Final = b"forgezero_lifecycle.serve.preload"
#: An app whose answer is fixed when its module is imported, so a generation shows which code
#: it imported, and whose import registers an ``atexit`` handler that leaves a file behind.
VERSIONED_APP: Final = """
import atexit
import os
import pathlib

VERSION = {version!r}
# Registered once, at the import (in the preload process): every process must run it as it ends.
atexit.register(
    lambda: pathlib.Path(os.environ["FZW_RECORDS"], f"{{os.getpid()}}.atexit").write_text("ran")
)


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({{"type": message["type"] + ".complete"}})
            if message["type"] == "lifespan.shutdown":
                return
    body = f"{{VERSION}} {{os.getpid()}}".encode()
    await send({{"type": "http.response.start", "status": 200, "headers": []}})
    await send({{"type": "http.response.body", "body": body}})
"""


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def _versioned(tmp_path: Path, version: str) -> None:
    (tmp_path / "versioned_app.py").write_text(VERSIONED_APP.format(version=version))


def _start_versioned(start_supervised: StartSupervised, tmp_path: Path) -> Supervised:
    _versioned(tmp_path, "one")
    return start_supervised(
        "--preload", "--app-dir", str(tmp_path), workers=2, target="versioned_app:app"
    )


def _answers(served: Supervised, count: int) -> set[str]:
    return {served.get("/").text for _ in range(count)}


def test_workers_are_forked_from_one_import(start_supervised: StartSupervised) -> None:
    """One preload process per generation, the supervisor's child; every worker is its child
    (forked, never importing the app itself) and answers."""
    served = start_supervised("--preload", workers=2)
    (preload,) = preloads(served.process.pid)
    workers = served.workers()
    assert len(workers) == 2
    assert {_parent(pid) for pid in workers} == {preload}
    assert f"supervisor.preloaded generation=1 pid={preload}" in served.log()
    assert served.pids_answering(2) == set(workers)


def test_forked_workers_end_as_the_interpreter_would(
    start_supervised: StartSupervised, tmp_path: Path
) -> None:
    """A forked worker leaves without the interpreter's teardown, but as its exit would: what
    the app's import registered with ``atexit`` (in the preload process) runs in every worker,
    and in the preload process itself."""
    served = _start_versioned(start_supervised, tmp_path)
    (preload,) = preloads(served.process.pid)
    workers = served.workers()
    served.signal(signal.SIGTERM)
    assert served.wait_exit() == 0
    served.wait_for(lambda: not alive(preload), "the preload process gone")
    ran = {int(path.stem) for path in served.records.glob("*.atexit")}
    assert ran == {*workers, preload}, served.log()


def test_sighup_imports_the_new_code(start_supervised: StartSupervised, tmp_path: Path) -> None:
    """A SIGHUP's generation has a preload process of its own, which imports the code on disk
    then; the old preload process exits with its generation."""
    served = _start_versioned(start_supervised, tmp_path)
    (old,) = preloads(served.process.pid)
    assert {answer.split()[0] for answer in _answers(served, 4)} == {"one"}
    _versioned(tmp_path, "two")
    served.signal(signal.SIGHUP)
    served.wait_log("supervisor.handover_done from=1 to=2")
    served.wait_for(lambda: not alive(old), "the first preload process gone")
    (new,) = preloads(served.process.pid)
    assert new != old
    assert {answer.split()[0] for answer in _answers(served, 4)} == {"two"}
    served.signal(signal.SIGTERM)
    assert served.wait_exit() == 0
    assert preloads(served.process.pid) == []


def test_import_that_fails_fails_the_start(
    start_supervised: StartSupervised, tmp_path: Path
) -> None:
    """An app that crashes on import: the preload process says why and its workers import the
    app themselves, which fails the start as without ``--preload`` (the worker's reason in the
    supervisor's message; exit 1)."""
    mode = tmp_path / "mode"
    mode.write_text("crash")
    served = start_supervised("--preload", workers=2, env={"FZW_MODE_FILE": str(mode)}, wait=False)
    assert served.wait_exit() == 1
    log = served.log()
    assert "supervisor.preload_failed generation=1" in log
    assert "its workers import the app themselves" in log
    assert "before it was ready" in log
    assert "crashes on import" in log


def test_workers_serve_on_when_the_preload_process_dies(
    start_supervised: StartSupervised, tmp_path: Path
) -> None:
    """The preload process killed: its workers serve on; a worker added now is spawned (it
    imports the app itself); the stop ends every worker, the forked ones' exit status unknown."""
    served = _start_versioned(start_supervised, tmp_path)
    (preload,) = preloads(served.process.pid)
    forked = served.workers()
    os.kill(preload, signal.SIGKILL)
    served.wait_log(f"supervisor.preload_lost pid={preload}")
    assert {int(answer.split()[1]) for answer in _answers(served, 6)} <= set(forked)
    served.signal(signal.SIGTTIN)
    served.wait_log("supervisor.replacement_done generation=1 kind=scale-up")
    added = set(served.workers()) - set(forked)
    assert len(added) == 1
    (spawned,) = added
    assert _parent(spawned) == served.process.pid
    assert PRELOAD_MODULE not in Path(f"/proc/{spawned}/cmdline").read_bytes()
    deadline = time.monotonic() + 30
    while spawned not in {int(answer.split()[1]) for answer in _answers(served, 4)}:
        assert time.monotonic() < deadline, served.log()
    served.signal(signal.SIGTERM)
    assert served.wait_exit() == 0
    log = served.log()
    for pid in forked:
        assert f"(pid {pid}) of generation 1 reason=exited, its status unknown" in log, log
