"""Which tasks are blocked in given coroutines: how the cutoff finds a wrapped request's send
that was blocked before the drain began (:class:`~forgezero_lifecycle.asgi.middleware.InFlightMiddleware`).

A task is blocked in a coroutine when that coroutine is in the task's chain of awaits: the
task's own coroutine, what it awaits, what that awaits, and so on down to the future the task
waits on. Only suspended coroutines are looked for (one that is done, or not started, blocks
nobody), and only in tasks that are not running, so a task waiting on anything else is never
named. This is read once per drain, at the cutoff, and costs the request path nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from types import CoroutineType
from typing import Any, Final, TypeVar

__all__ = ["tasks_blocked_in"]

T = TypeVar("T")

#: How far down a task's chain of awaits the search goes.
_DEEPEST_CHAIN: Final = 64


def tasks_blocked_in(
    coroutines: Iterable[tuple[T, CoroutineType[Any, Any, Any] | None]],
) -> Iterator[tuple[T, asyncio.Task[Any]]]:
    """For each ``(owner, coroutine)`` whose coroutine is suspended, the task blocked in it (if
    a task is: a coroutine may also be suspended with no task driving it)."""
    blocked: dict[int, tuple[T, CoroutineType[Any, Any, Any]]] = {}
    for owner, coroutine in coroutines:
        if coroutine is not None and coroutine.cr_await is not None and not coroutine.cr_running:
            blocked[id(coroutine)] = (owner, coroutine)
    if not blocked:
        return
    current = asyncio.current_task()
    for task in asyncio.all_tasks():
        if task is current or task.done():
            continue
        awaited: object | None = task.get_coro()
        for _ in range(_DEEPEST_CHAIN):
            found = blocked.get(id(awaited))
            if found is not None and found[1] is awaited:
                del blocked[id(awaited)]
                yield found[0], task
                break
            awaited = _awaited_by(awaited)
            if awaited is None:
                break
        if not blocked:
            return


def _awaited_by(awaiting: object) -> object | None:
    """What a suspended coroutine (or generator-based one, or async generator) waits on."""
    for name in ("cr_await", "gi_yieldfrom", "ag_await"):
        awaited: object | None = getattr(awaiting, name, None)
        if awaited is not None:
            return awaited
    return None
