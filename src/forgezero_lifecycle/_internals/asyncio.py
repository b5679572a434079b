"""Everything the library relies on of CPython's asyncio beyond its documented API.

* ``Event._waiters``: whether an app waits in ``receive()`` (a uvicorn cycle's
  ``message_event``), read by :mod:`forgezero_lifecycle.asgi._uvicorn` at a drain's notice;
* ``Queue._queue``: whether the disconnect a drain's notice put in a hypercorn stream's app
  queue is still there (:mod:`forgezero_lifecycle.asgi._hypercorn`);
* ``StreamWriter._protocol._paused``: whether a hypercorn connection's writes are paused by a
  client that does not read (the drain's cutoff gives such a send up);
* ``loop._signal_handlers`` and the ``Handle``'s ``_callback`` and ``_args``: the handler
  ``loop.add_signal_handler`` registered (hypercorn ``--workers 0``), which the runtime's
  signal hook replaces and puts back; and ``_sighandler_noop``, the name of what
  ``add_signal_handler`` leaves in Python's own signal table
  (:mod:`forgezero_lifecycle.core.signal_drain`).

Each reader returns what a missing internal means (no waiter, not paused, no handler), so a
CPython without one falls back; :func:`missing` names them for the start-up report.
"""

from __future__ import annotations

import asyncio
import asyncio.events
import asyncio.streams
import inspect
import platform
import signal
from collections.abc import Callable, Sized
from typing import Any, Final

__all__ = [
    "PRIVATE",
    "SIGNAL_NOOP_NAME",
    "code_names",
    "has_waiters",
    "is_signal_noop",
    "loop_signal_handler",
    "missing",
    "queued",
    "version",
    "write_paused",
]

#: The private names of asyncio this module reads (tests/test_internals.py checks the list).
PRIVATE: Final = frozenset(
    {
        "_waiters",
        "_queue",
        "_protocol",
        "_paused",
        "_signal_handlers",
        "_callback",
        "_args",
        "_UnixSelectorEventLoop",
        "_sighandler_noop",
    }
)
#: What ``loop.add_signal_handler`` leaves in Python's signal table (asyncio's own no-op).
SIGNAL_NOOP_NAME: Final = "_sighandler_noop"


def version() -> str:
    """The running Python's version (asyncio is CPython's)."""
    return f"{platform.python_implementation()} {platform.python_version()}"


def missing() -> list[str]:
    """The internals this asyncio lacks."""
    lacking: list[str] = []
    if not isinstance(getattr(asyncio.Event(), "_waiters", None), Sized):
        lacking.append("Event._waiters")
    if not isinstance(getattr(asyncio.Queue(), "_queue", None), Sized):
        lacking.append("Queue._queue")
    if "_protocol" not in _names(asyncio.StreamWriter.__init__):
        lacking.append("StreamWriter._protocol")
    if "_paused" not in _names(asyncio.streams.FlowControlMixin.__init__):
        lacking.append("FlowControlMixin._paused")
    slots = set(getattr(asyncio.events.Handle, "__slots__", ()))
    lacking += [f"Handle.{name}" for name in ("_callback", "_args") if name not in slots]
    unix_events = getattr(asyncio, "unix_events", None)
    if unix_events is not None:
        loop_class = getattr(unix_events, "_UnixSelectorEventLoop", None)
        if loop_class is None or "_signal_handlers" not in _names(loop_class.__init__):
            lacking.append("loop._signal_handlers")
        if not callable(getattr(unix_events, "_sighandler_noop", None)):
            lacking.append(f"unix_events.{SIGNAL_NOOP_NAME}")
    return lacking


def has_waiters(event: asyncio.Event) -> bool:
    """Whether a task waits on ``event`` (False where the waiters cannot be read)."""
    return bool(getattr(event, "_waiters", None))


def queued(queue: asyncio.Queue[Any]) -> tuple[Any, ...]:
    """The items in ``queue``, oldest first, without taking them (empty where unreadable)."""
    return tuple(getattr(queue, "_queue", ()))


def write_paused(writer: asyncio.StreamWriter) -> bool:
    """Whether ``writer``'s transport paused writing (the client does not read)."""
    return bool(getattr(getattr(writer, "_protocol", None), "_paused", False))


def loop_signal_handler(
    loop: asyncio.AbstractEventLoop, signum: signal.Signals | int
) -> tuple[Callable[..., object], tuple[object, ...]] | None:
    """The callback and arguments ``loop.add_signal_handler`` registered for ``signum``, read
    from the loop's private table; None when the loop has no such table (uvloop) or none is
    registered."""
    table = getattr(loop, "_signal_handlers", None)
    if not isinstance(table, dict):
        return None
    handle = table.get(signum)
    callback = getattr(handle, "_callback", None)
    args = getattr(handle, "_args", None)
    if not callable(callback) or not isinstance(args, tuple):
        return None
    return callback, args


def is_signal_noop(handler: object) -> bool:
    """Whether ``handler`` (from ``signal.getsignal``) is what ``loop.add_signal_handler``
    leaves in Python's signal table."""
    return getattr(handler, "__name__", "") == SIGNAL_NOOP_NAME


def _names(function: object) -> set[str]:
    """Every name a function and the functions nested in it refer to."""
    return code_names(getattr(function, "__code__", None))


def code_names(code: object) -> set[str]:
    """Every name a code object and the code objects nested in it refer to."""
    names: set[str] = set(getattr(code, "co_names", ()))
    for constant in getattr(code, "co_consts", ()):
        if inspect.iscode(constant):
            names |= code_names(constant)
    return names
