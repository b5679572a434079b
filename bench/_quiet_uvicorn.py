"""``python -m bench._quiet_uvicorn ...``: uvicorn's own command line, with its main loop waking
every 5 s instead of every 0.1 s, for ``bench.instructions``.

uvicorn's main loop wakes ten times a second whatever the server does (it refreshes the ``date``
header and looks for a request to exit). Under valgrind, where a request takes milliseconds, those
wake-ups add several hundred instructions per request, more on a busier machine: more than the
differences ``bench.instructions`` is there to count. Nothing else changes: the same protocol
classes, the same app, the same request path; the ``date`` header is refreshed every 5 s, and a
stop is noticed within 5 s.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Final

import uvicorn
from uvicorn.main import main

#: How often the main loop wakes.
TICK: Final = 5.0


async def _main_loop(self: uvicorn.Server) -> None:
    """uvicorn's ``Server.main_loop`` with a longer sleep (the same exit tests)."""
    should_exit = await self.on_tick(0)
    while not should_exit:
        await asyncio.sleep(TICK)
        should_exit = await self.on_tick(0)


if __name__ == "__main__":
    uvicorn.Server.main_loop = _main_loop  # type: ignore[method-assign]
    sys.exit(main())
