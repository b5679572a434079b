"""Nothing lost at the socket when the user's own single-process uvicorn stops on SIGTERM.

``uvicorn app:app`` with the runtime in the app: the runtime's signal hook drains on SIGTERM and
gives uvicorn's ``Server`` the stop of ``forgezero-lifecycle serve`` (its own listener refuses new
handshakes and is emptied before it closes, the first-byte grace, lingering closes), so the load
of ``test_zero_loss_stop.py`` loses nothing: every request is answered or refused (a 503 the app
never saw, or a refused connection), under both of uvicorn's HTTP implementations. Bare uvicorn
under the same load is measured in ``test_zero_loss_stop.py``.
"""

from __future__ import annotations

import signal
from typing import Final

import pytest

from ._fleet import Fleet
from ._soak import report, scale
from .test_zero_loss_stop import _stop_under_load

pytestmark = [pytest.mark.server, pytest.mark.load, pytest.mark.anyio]

#: Stops per HTTP implementation: one in make test (tests/reliability/test_user_load.py stops
#: ``uvicorn`` under a heavier load too), twenty under FORGEZERO_SOAK=1 (make soak).
RUNS: Final = scale(1, 20)


@pytest.mark.timeout(scale(240, 2400))
@pytest.mark.parametrize("kind", ["uvicorn-h11", "uvicorn-httptools"])
async def test_users_uvicorn_sigterm(fleet: Fleet, kind: str) -> None:
    """SIGTERM to the user's own uvicorn under load loses no request: every request that reaches the
    port is answered or refused, through the whole stop."""
    runs = [
        await _stop_under_load(fleet, kind, f"u{n}{kind[-3:]}", seed=200 + n) for n in range(RUNS)
    ]
    report(f"stop-under-load-{kind}-runtime", runs=runs, lost_per_run=[r["lost"] for r in runs])
    for run in runs:
        assert run["problems"] == [], run
        assert run["lost"] == 0, run
        # uvicorn raises the signal it stopped on again once its stop is over.
        assert run["exit_code"] == -signal.SIGTERM, run
        assert run["exposed_to_stop"] > 0, run
