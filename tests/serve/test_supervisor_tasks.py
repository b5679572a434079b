"""The supervisor's tasks belong to :meth:`Supervisor.run`: a failure in one is the supervisor's
failure, seen at once, and the workers do not outlive it.

The supervisor runs in this process with a real worker process on a real socket. The failure
itself is injected (a timer that raises once the worker is ready), because a bug in the
supervisor's own code cannot be made to happen from outside.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from forgezero_lifecycle.serve.listeners import held_listeners
from forgezero_lifecycle.serve.options import ServeOptions
from forgezero_lifecycle.serve.supervisor import Supervisor
from forgezero_lifecycle.serve.workers import WorkerHandle

from .conftest import BOUND

pytestmark = pytest.mark.server


class SupervisorBugError(Exception):
    """What the injected timer raises."""


def test_failed_task_ends_supervisor(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A supervisor task that raises ends ``run()`` with that error, logged with its traceback
    (it used to be dropped unseen while ``run()`` waited on); every worker it started is gone
    by then."""

    async def failing_timer(self: Supervisor, worker: WorkerHandle) -> None:
        await worker.ready.wait()
        raise SupervisorBugError("the start timer failed")

    monkeypatch.setattr(Supervisor, "_start_timer", failing_timer)
    options = ServeOptions(port=0, workers=1, insecure_loopback_control=True, log_level="warning")
    listeners = held_listeners(options.host, options.port)
    supervisor = Supervisor("tests.serve.plain_app:app", options, listeners, None)
    try:
        with pytest.raises(ExceptionGroup) as raised:
            asyncio.run(asyncio.wait_for(supervisor.run(), BOUND))
    finally:
        for listener in listeners:
            listener.sock.close()
    assert raised.group_contains(SupervisorBugError)
    assert "supervisor.crashed" in caplog.text
    assert "the start timer failed" in caplog.text
    processes = [
        worker.process
        for generation in supervisor._generations.values()
        for worker in generation.workers
        if worker.process is not None
    ]
    assert len(processes) == 1
    for process in processes:
        assert process.returncode is not None
        with pytest.raises(ProcessLookupError):
            os.kill(process.pid, 0)
