"""SIGTERM under load under the servers users run themselves, judged per request.

The same load and the same judgement as ``test_zero_loss_stop.py`` (one port, one attempt per
request: answered, refused, or lost), with the app's runtime hooked into the server's own signal
handling instead of ``forgezero-lifecycle serve``: plain uvicorn (h11, httptools), hypercorn in one
process and gunicorn with one uvicorn worker. The drain must happen (503 refusals, nothing admitted
and then cut, nothing refused and then run); what the server's own stop then loses at the socket
is measured and reported, not judged (only ``serve`` promises nothing lost there). hypercorn's
default, which cannot be hooked, is measured beside them.
"""

from __future__ import annotations

from typing import Final

import pytest

from ._fleet import Fleet
from ._soak import report, scale
from .test_zero_loss_stop import _stop_under_load

pytestmark = [pytest.mark.server, pytest.mark.load, pytest.mark.anyio]

HOOKED: Final = ("uvicorn-h11", "uvicorn-httptools", "hypercorn-single", "gunicorn")


@pytest.mark.timeout(scale(240, 2400))
async def test_plain_servers_drain(fleet: Fleet) -> None:
    """Each hooked server drains before its own stop: 503s, no admitted request cut."""
    runs = [
        await _stop_under_load(fleet, kind, f"p{n}{index}", seed=200 + n)
        for n in range(scale(1, 5))
        for index, kind in enumerate((*HOOKED, "hypercorn"))
    ]
    report(
        "stop-under-load-plain-servers",
        runs=runs,
        lost_per_run={f"{r['kind']}#{i}": r["lost"] for i, r in enumerate(runs)},
    )
    for run in runs:
        assert run["exposed_to_stop"] > 0, run
        not_lost = [p for p in run["problems"] if " lost: " not in p]
        assert not_lost == [], run  # nothing refused then run, nothing admitted then cut
        if run["kind"] in HOOKED:
            assert run["refused_503"] > 0, run  # the drain answered: the hook worked
        else:
            assert run["refused_503"] == 0, run  # hypercorn's default: no drain at all
