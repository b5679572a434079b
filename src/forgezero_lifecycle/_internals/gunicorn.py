"""Everything the gunicorn worker class (:mod:`forgezero_lifecycle.gunicorn`) relies on of
gunicorn and uvicorn-worker beyond their documented API, in one place.

* uvicorn-worker's ``UvicornWorker``: ``run()`` replaced, its ``config`` (a ``uvicorn.Config``
  built from gunicorn's settings in ``__init__``) and ``CONFIG_KWARGS``; and what it uses of
  gunicorn's ``Worker``: ``wsgi`` (the app), ``sockets``, ``cfg.graceful_timeout`` and
  ``handle_exit``;
* gunicorn's ``Arbiter.WORKER_BOOT_ERROR``: the exit status that tells the arbiter a worker
  could not start, as uvicorn-worker exits with it;
* uvicorn's ``Config.get_loop_factory()`` (uvicorn 0.36 and later): the worker's event loop, as
  uvicorn-worker builds it.

No underscore attribute of theirs is used. The worker class checks at start-up; without these
it runs uvicorn-worker's own worker (logged, naming both versions).
"""

from __future__ import annotations

import importlib.metadata
from typing import Final

from .asyncio import code_names

__all__ = ["PRIVATE", "missing", "version", "worker_boot_error"]

#: The private names of gunicorn and uvicorn-worker this library uses: none.
PRIVATE: Final[frozenset[str]] = frozenset()
_WORKER_ATTRIBUTES: Final = ("config", "CONFIG_KWARGS", "wsgi", "sockets", "cfg", "handle_exit")


def version() -> str:
    """The installed gunicorn's and uvicorn-worker's versions."""
    found = []
    for name in ("gunicorn", "uvicorn-worker"):
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} unknown")
    return ", ".join(found)


def missing() -> list[str]:
    """What this gunicorn and uvicorn-worker lack."""
    try:
        from gunicorn.arbiter import Arbiter
        from gunicorn.workers.base import Worker
        from uvicorn_worker import UvicornWorker
    except ImportError as error:
        return [str(error.name)]
    from uvicorn import Config

    lacking: list[str] = []
    if not isinstance(getattr(Arbiter, "WORKER_BOOT_ERROR", None), int):
        lacking.append("Arbiter.WORKER_BOOT_ERROR")
    if not callable(getattr(Config, "get_loop_factory", None)):  # uvicorn 0.36 and later
        lacking.append("uvicorn.Config.get_loop_factory")
    names: set[str] = set()
    for kind in (UvicornWorker, Worker):
        names |= set(vars(kind))
        for member in vars(kind).values():
            names |= code_names(getattr(member, "__code__", None))
    lacking += [f"UvicornWorker.{name}" for name in _WORKER_ATTRIBUTES if name not in names]
    return lacking


def worker_boot_error() -> int:
    """gunicorn's exit status for a worker that could not start."""
    from gunicorn.arbiter import Arbiter

    return int(Arbiter.WORKER_BOOT_ERROR)
