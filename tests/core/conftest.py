"""Fixtures of the core tests: a cyclic collector switched on, as in a running app."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture
def collector_enabled() -> Iterator[None]:
    """The collector on for the test, then as it was."""
    enabled = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        if not enabled:
            gc.disable()
