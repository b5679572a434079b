"""What a worker forked by ``serve --preload`` relies on of CPython beyond its documented API, to
end as the interpreter's own exit ends a process, without the interpreter's teardown.

* ``threading._shutdown``: joins the threads that are not daemons, and runs what
  ``concurrent.futures`` registered to stop its pools;
* ``atexit._run_exitfuncs``: the ``atexit`` handlers (an exporter's last flush, say).

:func:`exit_without_teardown` runs the two in the order ``Py_FinalizeEx`` does, flushes the
standard streams, and leaves with ``os._exit``: the process's memory goes with it. The teardown
it skips frees every object the preload process made, one by one, which writes to (and so
copies) every page the fork shared: about 25 ms of CPU a worker, 40 % of what a recycle cost
(``bench.recycling``). Without either internal the worker exits through the teardown.
"""

from __future__ import annotations

import atexit
import os
import platform
import sys
import threading
from typing import Final, NoReturn

__all__ = ["PRIVATE", "exit_without_teardown", "missing", "version"]

#: The private names this module reads (tests/test_internals.py checks the list); ``os._exit``
#: is documented, its name only looks private.
PRIVATE: Final = frozenset({"_shutdown", "_run_exitfuncs", "_exit"})


def version() -> str:
    """The running Python's version."""
    return f"{platform.python_implementation()} {platform.python_version()}"


def missing() -> list[str]:
    """The internals this Python lacks."""
    lacking: list[str] = []
    if not callable(getattr(threading, "_shutdown", None)):
        lacking.append("threading._shutdown")
    if not callable(getattr(atexit, "_run_exitfuncs", None)):
        lacking.append("atexit._run_exitfuncs")
    return lacking


def exit_without_teardown(code: int) -> NoReturn:
    """End this process with ``code`` as the interpreter's exit would, minus its teardown (see
    the module docstring); through the teardown (``SystemExit``) where an internal is missing."""
    if missing():
        raise SystemExit(code)
    threading._shutdown()  # type: ignore[attr-defined]  # private: not in typeshed's stubs
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    os._exit(code)
