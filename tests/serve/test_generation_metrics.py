"""Metrics under ``serve --workers N``: one scrape through the port covers the whole generation."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import StartSupervised, Supervised

pytestmark = pytest.mark.server

METRICS = "/.forgezero/runtime/metrics"


def _in_flight(served: Supervised) -> dict[tuple[str, str], float]:
    """``forgezero_in_flight`` samples of one scrape: (worker, kind) -> value."""
    response = served.get(METRICS)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(response.text):
        if family.name == "forgezero_in_flight":
            for sample in family.samples:
                found[(sample.labels["worker"], sample.labels["kind"])] = sample.value
    return found


def test_scrape_lists_every_worker(
    start_supervised: StartSupervised,
) -> None:
    """One scrape holds every worker, labelled, and sums the generation: whichever worker it lands
    on, it lists both workers; a held request counts once."""
    served = start_supervised(target="tests.ops.app:app", workers=2)
    for _ in range(6):  # scrapes land on either worker: each must show both
        assert {worker for worker, _ in _in_flight(served)} == {"0", "1"}
    outcome: list[Any] = []

    def hold() -> None:
        try:
            outcome.append(served.get("/slow?seconds=3").status_code)
        except httpx.HTTPError as error:
            outcome.append(error)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    served.wait_for(
        lambda: sum(v for (_, kind), v in _in_flight(served).items() if kind == "http") == 1,
        "the held request counted once across the generation",
    )
    thread.join(20)
    assert outcome == [200]
    served.wait_for(  # a merged scrape is reused for up to 1 s (METRICS_REUSE)
        lambda: sum(v for (_, kind), v in _in_flight(served).items() if kind == "http") == 0,
        "the finished request no longer counted",
    )


def test_no_metrics_not_found(
    start_supervised: StartSupervised,
) -> None:
    """A generation whose app serves no metrics answers not found: without ``Runtime(metrics=...)``
    the path is unknown, as it is for one process."""
    served = start_supervised(workers=2)
    response = served.get(METRICS)
    assert response.status_code == 404
    assert response.json()["error"] == "RUNTIME_NOT_FOUND"
