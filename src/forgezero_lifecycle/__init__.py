"""forgezero-lifecycle: hand an ASGI service over to its next generation with nothing lost.

Layers point down only (checked by import-linter in CI)::

    wire      pydantic models and constants of the control protocol; no I/O
    core      framework-neutral asyncio controllers: gate, drain, handoff, queue, scheduler
    jobs      durable fenced jobs: store protocol, SQLite, PostgreSQL, worker
    asgi      the only ASGI/Starlette speakers: in-flight middleware, control sub-app
    client    httpx client of the control protocol (orchestrator side)
    runtime   the composition root; serve and cli sit on top of it
"""

from __future__ import annotations

__all__: list[str] = []
