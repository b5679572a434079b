"""Fixtures of the reliability tests: a fleet of generations that is always cleaned up."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.jobs.conftest import postgres_dsn

from ._fleet import Fleet
from ._jobs import SharedJobs, open_shared_jobs


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    """Generations started by this test; every one is stopped by PID afterwards."""
    made = Fleet(tmp_path)
    try:
        yield made
    finally:
        await made.aclose()


@pytest.fixture(
    params=[pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def jobs(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SharedJobs]:
    """A fresh job database shared by the test and its generations (SQLite, then PostgreSQL)."""
    dsn = postgres_dsn() if request.param == "postgres" else None
    shared = await open_shared_jobs(request.param, tmp_path, dsn)
    try:
        yield shared
    finally:
        await shared.close()


@pytest.fixture
async def sqlite_jobs(tmp_path: Path) -> AsyncIterator[SharedJobs]:
    """A fresh SQLite job database shared by the test and its generations."""
    shared = await open_shared_jobs("sqlite", tmp_path, None)
    try:
        yield shared
    finally:
        await shared.close()
