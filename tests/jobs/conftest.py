"""Fixtures for the job tests: the anyio backend, PostgreSQL access and one kit per store."""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from forgezero_lifecycle.jobs import MemoryJobStore, SQLiteJobStore
from forgezero_lifecycle.jobs.postgres import PostgresJobStore

DSN_ENV = "FORGEZERO_TEST_POSTGRES_DSN"


def postgres_dsn() -> str:
    """The test database, or skip (fail in CI) with a reason that names the variable."""
    dsn = os.environ.get(DSN_ENV, "")
    if not dsn:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{DSN_ENV} is not set: CI must run the PostgreSQL job tests")
        pytest.skip(f"PostgreSQL tests skipped: set {DSN_ENV} (e.g. postgresql://user@host/db)")
    return dsn


@pytest.fixture
def pg_dsn() -> str:
    return postgres_dsn()


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    """A fresh schema name for this test; dropped afterwards."""
    schema = f"fz_test_{uuid.uuid4().hex[:12]}"
    yield schema
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


class StoreKit:
    """One store under test, plus the application table a handler writes in."""

    name = "base"
    store: Any

    def __init__(self) -> None:
        self._others: list[Any] = []

    async def other(self) -> Any:
        """Another handle on the same database (its own connection / thread)."""
        raise NotImplementedError

    async def mark(self, conn: Any, key: str) -> None:
        """The handler's own write, inside ``conn``'s transaction."""
        raise NotImplementedError

    async def marked(self, key: str) -> bool:
        """Whether the handler's write is committed."""
        raise NotImplementedError

    async def close(self) -> None:
        for other in self._others:
            await other.close()
        await self.store.close()


class MemoryKit(StoreKit):
    name = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryJobStore()

    async def other(self) -> Any:
        return self.store

    async def mark(self, conn: Any, key: str) -> None:
        conn.put("marks", key, True)

    async def marked(self, key: str) -> bool:
        return key in self.store.table("marks")


class SQLiteKit(StoreKit):
    name = "sqlite"

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.store = SQLiteJobStore(path)

    async def setup(self) -> None:
        await self.store.open()
        async with self.store.transaction() as tx:
            await tx.execute("CREATE TABLE app_marks (key TEXT PRIMARY KEY)")

    async def other(self) -> Any:
        other = SQLiteJobStore(self.path)
        await other.open()
        self._others.append(other)
        return other

    async def mark(self, conn: Any, key: str) -> None:
        await conn.execute("INSERT INTO app_marks (key) VALUES (?)", (key,))

    async def marked(self, key: str) -> bool:
        with sqlite3.connect(self.path) as conn:
            row = conn.execute("SELECT 1 FROM app_marks WHERE key = ?", (key,)).fetchone()
        conn.close()
        return row is not None


class PostgresKit(StoreKit):
    name = "postgres"

    def __init__(self, dsn: str, schema: str) -> None:
        super().__init__()
        self.dsn = dsn
        self.schema = schema
        self.store = PostgresJobStore(dsn, schema=schema, max_size=4)

    async def setup(self) -> None:
        await self.store.open()
        async with self.store.transaction() as conn:
            await conn.execute(f'CREATE TABLE "{self.schema}".app_marks (key text PRIMARY KEY)')

    async def other(self) -> Any:
        other = PostgresJobStore(self.dsn, schema=self.schema, max_size=2)
        await other.open()
        self._others.append(other)
        return other

    async def mark(self, conn: Any, key: str) -> None:
        await conn.execute(f'INSERT INTO "{self.schema}".app_marks (key) VALUES (%s)', (key,))

    async def marked(self, key: str) -> bool:
        async with await psycopg.AsyncConnection.connect(self.dsn) as conn:
            cur = await conn.execute(
                f'SELECT 1 FROM "{self.schema}".app_marks WHERE key = %s', (key,)
            )
            return await cur.fetchone() is not None


STORE_PARAMS = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=STORE_PARAMS)
async def kit(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreKit]:
    """Each contract test runs once per store."""
    made: StoreKit
    if request.param == "memory":
        made = MemoryKit()
    elif request.param == "sqlite":
        made = SQLiteKit(tmp_path / "jobs.db")
        await made.setup()
    else:
        made = PostgresKit(postgres_dsn(), request.getfixturevalue("pg_schema"))
        await made.setup()
    try:
        yield made
    finally:
        await made.close()
