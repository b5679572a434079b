"""Fixtures of the security tests: real server generations, always cleaned up."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.reliability._fleet import Fleet


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    """Generations started by this test; every one is stopped by PID afterwards."""
    made = Fleet(tmp_path)
    try:
        yield made
    finally:
        await made.aclose()
