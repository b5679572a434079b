"""What this library relies on of other libraries beyond their documented API: one module each.

* :mod:`.uvicorn`: uvicorn's server, config, HTTP protocols and request cycles;
* :mod:`.hypercorn`: hypercorn's HTTP/1 and HTTP/2 streams and protocols (asyncio worker);
* :mod:`.asyncio`: CPython's asyncio (event waiters, a queue's items, a stream's write pause,
  the loop's signal handler table);
* :mod:`.gunicorn`: gunicorn's worker and uvicorn-worker's ``UvicornWorker``;
* :mod:`.interpreter`: CPython's own exit steps (``threading._shutdown``, ``atexit``'s
  handlers), for a worker forked by ``serve --preload`` to end without the interpreter's
  teardown.

Each module lists the internals it relies on, reads or calls the private ones itself (no other
module of the library touches another library's underscore attribute:
``tests/test_internals.py`` walks the source), and has ``missing()``, naming what the
installed version lacks. Every way a library runs checks at start-up:

* ``forgezero-lifecycle serve``: uvicorn's list refuses to start without it, the others are
  reported (:func:`report`);
* the runtime's signal hook, inside a uvicorn, hypercorn or gunicorn the user runs
  (:meth:`forgezero_lifecycle.core.signal_drain.SignalDrain.install`): :func:`report` for
  each library loaded;
* the gunicorn worker class (:mod:`forgezero_lifecycle.gunicorn`): gunicorn's and uvicorn's
  lists; without them it runs uvicorn-worker's own worker.

What is missing is logged once per library and process, with the library's version, and the
path that needs it falls back (the wrapped middleware, uvicorn's own stop, no signal hook).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Final

__all__ = ["LIBRARIES", "report"]

logger = logging.getLogger("forgezero_lifecycle.internals")

#: The libraries with a module here, as ``sys.modules`` names them (``interpreter``: the
#: running CPython itself, always there).
LIBRARIES: Final = ("asyncio", "uvicorn", "hypercorn", "gunicorn", "interpreter")
_ALWAYS_LOADED: Final = frozenset({"interpreter"})

#: What falls back, per library, when something it lists is missing.
_FALLBACK: Final = {
    "asyncio": "requests under uvicorn and hypercorn are wrapped by the middleware, and a "
    "signal handler the event loop holds is not hooked",
    "uvicorn": "uvicorn's own stop runs and requests are wrapped by the middleware",
    "hypercorn": "requests are wrapped by the middleware and HTTP/2 clients get no GOAWAY",
    "gunicorn": "the worker class runs uvicorn-worker's own worker, without the zero-loss stop",
    "interpreter": "a worker forked by serve --preload exits through the interpreter's "
    "teardown (about 25 ms of CPU more)",
}
#: Libraries already reported in this process.
_REPORTED: Final[set[str]] = set()


def report(libraries: tuple[str, ...] = LIBRARIES) -> dict[str, list[str]]:
    """Check each of ``libraries`` that is imported in this process; log what one lacks (once
    per library and process, naming its version). ``{library: missing}`` of those lacking."""
    lacking: dict[str, list[str]] = {}
    for name in libraries:
        if name not in sys.modules and name not in _ALWAYS_LOADED:
            continue  # not the server this process runs
        version, missing = _checker(name)()
        if not missing:
            continue
        lacking[name] = missing
        if name not in _REPORTED:
            _REPORTED.add(name)
            logger.warning(
                "internals.missing library=%s version=%s missing=%s: %s",
                name,
                version,
                ",".join(missing),
                _FALLBACK[name],
            )
    return lacking


def _checker(name: str) -> Callable[[], tuple[str, list[str]]]:
    if name == "asyncio":
        from . import asyncio

        return lambda: (asyncio.version(), asyncio.missing())
    if name == "uvicorn":
        from . import uvicorn

        return lambda: (uvicorn.version(), uvicorn.missing())
    if name == "hypercorn":
        from . import hypercorn

        return lambda: (hypercorn.version(), hypercorn.missing())
    if name == "interpreter":
        from . import interpreter

        return lambda: (interpreter.version(), interpreter.missing())
    from . import gunicorn

    return lambda: (gunicorn.version(), gunicorn.missing())
