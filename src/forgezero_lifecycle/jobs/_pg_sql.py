"""Schema, migrations and statements of the PostgreSQL job store, for one schema name."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, final

from .._errors import ConfigurationError
from .store import Job

__all__ = ["MIGRATIONS", "Statements", "row_to_job"]

_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def _cols(p: str = "") -> str:
    return (
        f"{p}id, {p}queue, {p}payload, {p}idempotency_key, {p}state, {p}attempts,"
        f" {p}max_attempts, extract(epoch FROM {p}run_after)::float8, {p}fence, {p}lease_owner,"
        f" extract(epoch FROM {p}lease_until)::float8, {p}last_error, {p}result"
    )


#: Statements of version i + 1 ({s} is the quoted schema); append, never edit an applied one.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE IF NOT EXISTS {s}.jobs (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            queue text NOT NULL,
            payload jsonb NOT NULL,
            payload_hash text NOT NULL,
            idempotency_key text NOT NULL UNIQUE,
            state text NOT NULL DEFAULT 'queued'
                CHECK (state IN ('queued', 'leased', 'done', 'dead')),
            attempts integer NOT NULL DEFAULT 0,
            max_attempts integer NOT NULL CHECK (max_attempts >= 1),
            run_after timestamptz NOT NULL DEFAULT now(),
            fence bigint NOT NULL DEFAULT 0,
            lease_owner text,
            lease_until timestamptz,
            last_error text,
            result jsonb,
            created_at timestamptz NOT NULL DEFAULT now(),
            updated_at timestamptz NOT NULL DEFAULT now()
        )""",
        "CREATE INDEX IF NOT EXISTS jobs_due ON {s}.jobs (run_after, id) WHERE state = 'queued'",
        "CREATE INDEX IF NOT EXISTS jobs_leases ON {s}.jobs (lease_until) WHERE state = 'leased'",
        # The claim's pick runs in a function so its plan never depends on table statistics:
        # with stale statistics (a fresh burst of jobs) PostgreSQL would otherwise pick a
        # bitmap scan plus a sort of every due job on each claim instead of reading the first n
        # rows of jobs_due in order.
        """CREATE OR REPLACE FUNCTION {s}.due_jobs(n integer, queues text[])
            RETURNS SETOF bigint LANGUAGE sql VOLATILE
            SET enable_bitmapscan = off SET enable_seqscan = off
            AS $fn$ SELECT id FROM {s}.jobs WHERE state = 'queued' AND run_after <= now()
                AND (queues IS NULL OR queue = ANY(queues))
                ORDER BY run_after, id LIMIT n FOR UPDATE SKIP LOCKED $fn$""",
    ),
)
LATEST = len(MIGRATIONS)


def row_to_job(row: tuple[Any, ...]) -> Job:
    return Job(
        id=row[0],
        queue=row[1],
        payload=row[2],
        idempotency_key=row[3],
        state=row[4],
        attempts=row[5],
        max_attempts=row[6],
        run_after=row[7],
        fence=row[8],
        lease_owner=row[9],
        lease_until=row[10],
        last_error=row[11],
        result=row[12],
    )


def check_schema_name(schema: str) -> str:
    if not isinstance(schema, str) or _SCHEMA_NAME.fullmatch(schema) is None:
        raise ConfigurationError(
            detail=f"schema must be a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*, <= 63), got {schema!r}"
        )
    return schema


@final
@dataclass(frozen=True, slots=True)
class Statements:
    """Every statement of the store with the schema name filled in once."""

    schema_setup: tuple[str, ...]
    version: str
    record_version: str
    insert: str
    insert_many: str
    by_key: str
    by_keys: str
    claim_any: str
    claim_queues: str
    heartbeat: str
    held_for_update: str
    complete: str
    complete_many: str
    fail: str
    release: str
    release_owner: str
    reclaim: str
    get: str
    stats: str

    @classmethod
    def for_schema(cls, quoted: str) -> Statements:
        s = quoted
        j = f"{s}.jobs"
        claim = (
            f"UPDATE {j} SET state = 'leased', fence = fence + 1, attempts = attempts + 1,"
            " lease_owner = %(owner)s, lease_until = now() + %(lease)s * interval '1 second',"
            f" updated_at = now() WHERE id = ANY(ARRAY(SELECT {s}.due_jobs(%(n)s, {{queues}})))"
            f" RETURNING {_cols()}"
        )
        return cls(
            schema_setup=(
                f"CREATE SCHEMA IF NOT EXISTS {s}",
                f"CREATE TABLE IF NOT EXISTS {s}.schema_version (version integer PRIMARY KEY,"
                " applied_at timestamptz NOT NULL DEFAULT now())",
            ),
            version=f"SELECT coalesce(max(version), 0) FROM {s}.schema_version",
            record_version=f"INSERT INTO {s}.schema_version (version) VALUES (%s)",
            insert=(
                f"INSERT INTO {j} (queue, payload, payload_hash, idempotency_key, max_attempts,"
                " run_after) VALUES (%s, %s::jsonb, %s, %s, %s, now() + %s * interval '1 second')"
                # Only what the insert did not know: the rest of the new row is in its arguments.
                " ON CONFLICT (idempotency_key) DO NOTHING"
                " RETURNING id, extract(epoch FROM run_after)::float8"
            ),
            # The arrays go in binary (%b): psycopg escapes every element of a text-format array
            # with a regular expression, a third of the batch's client time at 10,000 jobs.
            insert_many=(
                f"INSERT INTO {j} (queue, payload, payload_hash, idempotency_key, max_attempts,"
                " run_after) SELECT %(queue)s, t.payload::jsonb, t.hash, t.key,"
                " %(max_attempts)s, now() + %(delay)s * interval '1 second'"
                " FROM unnest(%(payloads)b::text[], %(hashes)b::text[], %(keys)b::text[])"
                " WITH ORDINALITY AS t(payload, hash, key, n) ORDER BY t.n"
                " ON CONFLICT (idempotency_key) DO NOTHING"
                " RETURNING id, idempotency_key, payload, extract(epoch FROM run_after)::float8"
            ),
            by_key=f"SELECT {_cols()}, payload_hash FROM {j} WHERE idempotency_key = %s",
            by_keys=(
                f"SELECT {_cols()}, payload_hash FROM {j} WHERE idempotency_key = ANY(%b::text[])"
            ),
            claim_any=claim.format(queues="NULL"),
            claim_queues=claim.format(queues="%(queues)s::text[]"),
            heartbeat=(
                "WITH input AS (SELECT * FROM unnest(%s::bigint[], %s::bigint[]) AS t(id, fence)),"
                f" locked AS (SELECT j.id FROM {j} AS j JOIN input AS i"
                " ON j.id = i.id AND j.fence = i.fence WHERE j.id = ANY(%s::bigint[])"
                " AND j.state = 'leased' ORDER BY j.id FOR NO KEY UPDATE OF j SKIP LOCKED),"
                f" upd AS (UPDATE {j} AS j SET lease_until = now() + %s * interval '1 second'"
                " WHERE j.id = ANY(ARRAY(SELECT id FROM locked)) RETURNING j.id)"
                f" SELECT i.id, i.fence FROM input AS i WHERE NOT EXISTS (SELECT 1 FROM {j} AS j"
                " WHERE j.id = i.id AND j.fence = i.fence AND j.state = 'leased')"
            ),
            held_for_update=(
                f"SELECT 1 FROM {j} WHERE id = %s AND fence = %s AND state = 'leased'"
                " FOR NO KEY UPDATE"
            ),
            complete=(
                f"UPDATE {j} SET state = 'done', result = %s::jsonb, lease_owner = NULL,"
                " lease_until = NULL, updated_at = now()"
                " WHERE id = %s AND fence = %s AND state = 'leased'"
            ),
            complete_many=(
                "WITH input AS (SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::text[])"
                f" AS t(id, fence, result)), locked AS (SELECT j.id, i.result FROM {j} AS j"
                " JOIN input AS i ON j.id = i.id AND j.fence = i.fence"
                " WHERE j.id = ANY(%s::bigint[]) AND j.state = 'leased'"
                " ORDER BY j.id FOR NO KEY UPDATE OF j)"
                f" UPDATE {j} AS j SET state = 'done', result = locked.result::jsonb,"
                " lease_owner = NULL, lease_until = NULL, updated_at = now()"
                " FROM locked WHERE j.id = ANY(%s::bigint[]) AND j.id = locked.id"
                " RETURNING j.id, j.fence"
            ),
            fail=(
                f"UPDATE {j} SET"
                " state = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'queued' END,"
                " run_after = CASE WHEN attempts >= max_attempts THEN run_after"
                " ELSE now() + %s * interval '1 second' END, last_error = %s,"
                " lease_owner = NULL, lease_until = NULL, updated_at = now()"
                f" WHERE id = %s AND fence = %s AND state = 'leased' RETURNING {_cols()}"
            ),
            release=(
                f"UPDATE {j} SET state = 'queued', attempts = attempts - 1, run_after = now(),"
                " lease_owner = NULL, lease_until = NULL, updated_at = now()"
                " WHERE id = %s AND fence = %s AND state = 'leased'"
            ),
            release_owner=(
                f"WITH mine AS (SELECT id FROM {j} WHERE state = 'leased' AND lease_owner = %s"
                " ORDER BY id FOR NO KEY UPDATE)"
                f" UPDATE {j} AS j SET state = 'queued', attempts = j.attempts - 1,"
                " run_after = now(), lease_owner = NULL, lease_until = NULL, updated_at = now()"
                " FROM mine WHERE j.id = mine.id"
            ),
            reclaim=(
                f"WITH expired AS (SELECT id FROM {j} WHERE state = 'leased'"
                " AND lease_until < now() ORDER BY id FOR NO KEY UPDATE SKIP LOCKED)"
                f" UPDATE {j} AS j SET"
                " state = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'queued' END,"
                " run_after = now(), last_error = 'lease expired', lease_owner = NULL,"
                " lease_until = NULL, updated_at = now() FROM expired WHERE j.id = expired.id"
            ),
            get=f"SELECT {_cols()} FROM {j} WHERE id = %s",
            stats=f"SELECT state, count(*) FROM {j} GROUP BY state",
        )
