"""Schema, migrations and statements of the SQLite job store (synchronous, run on its thread)."""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson

from .._errors import JobStoreError
from .store import Job

__all__ = ["COLUMNS", "migrate", "row_to_job"]

COLUMNS = (
    "id, queue, payload, idempotency_key, state, attempts, max_attempts, run_after, fence, "
    "lease_owner, lease_until, last_error, result"
)

#: Statements of version i + 1; append new versions, never edit an applied one.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE IF NOT EXISTS forgezero_jobs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            queue TEXT NOT NULL,
            payload TEXT NOT NULL,
            payload_hash TEXT NOT NULL,
            idempotency_key TEXT NOT NULL UNIQUE,
            state TEXT NOT NULL DEFAULT 'queued'
                CHECK (state IN ('queued', 'leased', 'done', 'dead')),
            attempts INTEGER NOT NULL DEFAULT 0,
            max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
            run_after REAL NOT NULL,
            fence INTEGER NOT NULL DEFAULT 0,
            lease_owner TEXT,
            lease_until REAL,
            last_error TEXT,
            result TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        """CREATE INDEX IF NOT EXISTS forgezero_jobs_due
            ON forgezero_jobs (run_after, id) WHERE state = 'queued'""",
        """CREATE INDEX IF NOT EXISTS forgezero_jobs_leases
            ON forgezero_jobs (lease_until) WHERE state = 'leased'""",
    ),
)

LATEST = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection) -> int:
    """Create or upgrade the schema inside ``BEGIN IMMEDIATE``; returns the version now in use."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS forgezero_jobs_schema_version ("
            "version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)"
        )
        row = conn.execute("SELECT max(version) FROM forgezero_jobs_schema_version").fetchone()
        current = int(row[0] or 0)
        if current > LATEST:
            raise JobStoreError(
                "JOB_STORE_SCHEMA",
                f"the job database is at schema version {current}, newer than this library's "
                f"{LATEST}; upgrade forgezero-lifecycle in this generation",
            )
        for version in range(current + 1, LATEST + 1):
            for statement in MIGRATIONS[version - 1]:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO forgezero_jobs_schema_version (version) VALUES (?)", (version,)
            )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return LATEST


def row_to_job(row: tuple[Any, ...]) -> Job:
    return Job(
        id=row[0],
        queue=row[1],
        payload=orjson.loads(row[2]),
        idempotency_key=row[3],
        state=row[4],
        attempts=row[5],
        max_attempts=row[6],
        run_after=row[7],
        fence=row[8],
        lease_owner=row[9],
        lease_until=row[10],
        last_error=row[11],
        result=None if row[12] is None else orjson.loads(row[12]),
    )


_VALUES = "(?, ?, ?, ?, ?, ?, ?, ?)"


def insert(rows: int = 1) -> str:
    """An insert of ``rows`` rows returning what the arguments do not say: id (and the key)."""
    return (
        "INSERT INTO forgezero_jobs (queue, payload, payload_hash, idempotency_key, max_attempts,"
        f" run_after, created_at, updated_at) VALUES {', '.join([_VALUES] * rows)}"
        " ON CONFLICT (idempotency_key) DO NOTHING RETURNING id, idempotency_key"
    )


INSERT = insert()
BY_KEY = f"SELECT {COLUMNS}, payload_hash FROM forgezero_jobs WHERE idempotency_key = ?"
#: The keys as one JSON array parameter: no limit on how many.
BY_KEYS = (
    f"SELECT {COLUMNS}, payload_hash FROM forgezero_jobs"
    " WHERE idempotency_key IN (SELECT value FROM json_each(?))"
)
CLAIM = (
    "UPDATE forgezero_jobs SET state = 'leased', fence = fence + 1, attempts = attempts + 1,"
    " lease_owner = ?, lease_until = ?, updated_at = ? WHERE id IN ("
    "SELECT id FROM forgezero_jobs WHERE state = 'queued' AND run_after <= ? {queues}"
    " ORDER BY run_after, id LIMIT ?)"
    f" RETURNING {COLUMNS}"
)
CLAIM_ANY = CLAIM.format(queues="")
CLAIM_QUEUES = CLAIM.format(queues="AND queue IN (SELECT value FROM json_each(?))")
HELD = "SELECT 1 FROM forgezero_jobs WHERE id = ? AND fence = ? AND state = 'leased'"
HEARTBEAT = (
    "UPDATE forgezero_jobs SET lease_until = ? WHERE id = ? AND fence = ? AND state = 'leased'"
)
COMPLETE = (
    "UPDATE forgezero_jobs SET state = 'done', result = ?, lease_owner = NULL,"
    " lease_until = NULL, updated_at = ? WHERE id = ? AND fence = ? AND state = 'leased'"
)
FAIL = (
    "UPDATE forgezero_jobs SET"
    " state = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'queued' END,"
    " run_after = CASE WHEN attempts >= max_attempts THEN run_after ELSE ? END,"
    " last_error = ?, lease_owner = NULL, lease_until = NULL, updated_at = ?"
    f" WHERE id = ? AND fence = ? AND state = 'leased' RETURNING {COLUMNS}"
)
RELEASE = (
    "UPDATE forgezero_jobs SET state = 'queued', attempts = attempts - 1, run_after = ?,"
    " lease_owner = NULL, lease_until = NULL, updated_at = ?"
    " WHERE id = ? AND fence = ? AND state = 'leased'"
)
RELEASE_OWNER = (
    "UPDATE forgezero_jobs SET state = 'queued', attempts = attempts - 1, run_after = ?,"
    " lease_owner = NULL, lease_until = NULL, updated_at = ?"
    " WHERE state = 'leased' AND lease_owner = ?"
)
RECLAIM = (
    "UPDATE forgezero_jobs SET"
    " state = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'queued' END,"
    " run_after = ?, last_error = 'lease expired', lease_owner = NULL, lease_until = NULL,"
    " updated_at = ? WHERE state = 'leased' AND lease_until < ?"
)
GET = f"SELECT {COLUMNS} FROM forgezero_jobs WHERE id = ?"
STATS = "SELECT state, count(*) FROM forgezero_jobs GROUP BY state"
