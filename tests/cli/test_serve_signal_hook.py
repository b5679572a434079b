"""Under `forgezero-lifecycle serve` the runtime's own signal hook stays off: serve drains."""

from __future__ import annotations

import signal

import pytest

from .conftest import StartServe

pytestmark = pytest.mark.server


def test_app_signal_hook_off(start_serve: StartServe) -> None:
    """serve turns the app's signal hook off: the app's runtime (drain_on_signal left on) neither
    hooks nor warns; serve's drain runs."""
    served = start_serve("tests.cli.apps:app", "--drain-timeout", "10s")
    served.signal(signal.SIGTERM)
    assert served.wait_exit() == 0

    log = served.log()
    assert "serve.drain_settled state=drained" in log
    assert "signal.hooked" not in log
    assert "signal.unhookable" not in log
    assert "signal.drain" not in log
