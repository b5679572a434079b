"""A failure in the supervisor's own code ends it: its workers are stopped and ``serve`` exits
1 naming the cause, instead of the failure being logged and the supervisor going on with a
machine that believes the failed step was done.

Real ``serve --workers`` processes; the fault itself is injected (tests/serve/faulty_supervisor.py),
because a bug in the supervisor cannot be made to happen from outside.
"""

from __future__ import annotations

import signal

import pytest

from .conftest import AUTH, StartSupervised, alive

pytestmark = pytest.mark.server

#: A failed supervisor stops its workers (forced) and kills what is left 2 s later; margin 8 s.
_EXIT_BOUND = 10.0


def _assert_failed(served: object, cause: str) -> None:
    from .conftest import Supervised

    assert isinstance(served, Supervised)
    workers = set(served.workers())
    assert served.wait_exit(_EXIT_BOUND) == 1, served.log()
    log = served.log()
    assert "supervisor.failed" in log, log
    assert cause in log, log
    assert "unexpected SupervisorFailedError" in log, log  # the command line's last word
    assert not [pid for pid in workers | served.seen if alive(pid)], log
    assert "supervisor.worker_killed" not in log, log  # stopped, not killed


def test_failed_action_ends_supervisor(start_supervised: StartSupervised) -> None:
    """The action that lets generation 2 accept raises: before, ``supervisor.action_failed``
    was logged and the supervisor went on (the handover never ended, the process never
    exited); now it stops every worker of both generations and exits 1."""
    served = start_supervised(
        workers=2, module="tests.serve.faulty_supervisor", env={"FZW_FAULT": "accept"}
    )
    served.signal(signal.SIGHUP)
    served.wait_for(lambda: len(served.workers()) == 4, "generation 2 started")
    _assert_failed(served, "the new generation's accept failed")


def test_failed_channel_handler_ends_supervisor(start_supervised: StartSupervised) -> None:
    """The supervisor's answer to a worker's forwarded call raises: before, the caller got a
    500 and ``channel.handler_failed`` was logged while the supervisor went on; now the
    supervisor stops its workers and exits 1."""
    served = start_supervised(
        workers=2, module="tests.serve.faulty_supervisor", env={"FZW_FAULT": "schedules"}
    )
    response = served.get("/.forgezero/runtime/schedules/v1/status", headers=AUTH)
    assert response.status_code >= 500, response.text
    _assert_failed(served, "the schedules answer failed")
