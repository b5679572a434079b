"""Shared test configuration: every async test runs on asyncio; under pytest-xdist the longest
tests start first."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


def _runs_long(item: pytest.Item) -> bool:
    """Real-process tests (marked ``server``) and hypothesis searches: a few seconds to a minute
    each, where most of the others take milliseconds."""
    if item.get_closest_marker("server") is not None:
        return True
    return bool(getattr(getattr(item, "obj", None), "is_hypothesis_test", False)) or (
        item.cls is not None and item.name == "runTest"  # a hypothesis RuleBasedStateMachine
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, hand the long tests out first (the rest, in collection order, fill
    the gaps), so that the last minute of a run is not one long test started late."""
    if not getattr(config.option, "numprocesses", None):
        return
    items.sort(key=lambda item: not _runs_long(item))  # stable: collection order within each
