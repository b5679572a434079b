"""The reliability app (``tests/reliability/app.py``) as a supervised generation's worker.

Every worker writes its own records: ``FZREL_RECORDS`` is a template whose ``{pid}`` becomes the
worker's PID (``tests/reliability/app.py`` fills it in at each process's first record).
``FZW_MODE_FILE`` is read at import, so each generation reads it anew: ``crash`` raises on
import, ``hang`` never finishes the lifespan startup (never ready).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette

_MODE_FILE = Path(os.environ.get("FZW_MODE_FILE", "/nonexistent"))
MODE = _MODE_FILE.read_text().strip() if _MODE_FILE.exists() else "ok"
if MODE == "crash":
    raise RuntimeError("this generation crashes on import (FZW_MODE_FILE says so)")

from tests.reliability.app import app  # noqa: E402 - a crashing generation never builds it

if MODE == "hang":

    @asynccontextmanager
    async def _never_ready(app: Starlette) -> AsyncIterator[None]:
        await asyncio.Event().wait()
        yield

    app.router.lifespan_context = _never_ready

__all__ = ["app"]
