"""Which processes hold, and which accept on, a listening socket, read from Linux's ``/proc``.

A process holds a kernel socket while one of its descriptors refers to it (``/proc/<pid>/fd``
links read ``socket:[<inode>]``); it accepts on a listener while its event loop's epoll set
watches the listener for input: ``/proc/<pid>/fdinfo/<epoll fd>`` has one ``tfd:`` line per
watched descriptor, with its events and the inode of its file (``fs/eventpoll.c``). asyncio's
selector and libuv (uvloop) both register a serving listener that way and remove it when they
stop serving it.

Elsewhere, or when ``/proc`` cannot be read, nothing is found.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Final

__all__ = ["accepting_elsewhere", "parent_holds", "parent_of", "socket_inodes"]

_PROC: Final = Path("/proc")
_EPOLL: Final = "anon_inode:[eventpoll]"
_WATCHED: Final = re.compile(r"^tfd:\s*\d+\s+events:\s*([0-9a-f]+)\s.*?\bino:([0-9a-f]+)", re.M)
_EPOLLIN: Final = 0x001


def socket_inodes(pid: int | str) -> dict[int, int]:
    """``{inode: fd}`` of the sockets among ``pid``'s descriptors (empty when unreadable)."""
    found: dict[int, int] = {}
    try:
        entries = list((_PROC / str(pid) / "fd").iterdir())
    except OSError:
        return found
    for entry in entries:
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if target.startswith("socket:["):
            found[int(target[8:-1])] = int(entry.name)
    return found


def parent_of(pid: int) -> int | None:
    """``pid``'s parent, or None when it is gone or a zombie."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[1]) if fields[0] != "Z" else None


def parent_holds(inodes: set[int]) -> bool:
    """Whether this process's parent holds one of ``inodes``: gunicorn's arbiter does until its
    final stop, when it closes its listeners before it stops the workers."""
    parent = os.getppid()
    if not inodes or parent <= 1 or not sys.platform.startswith("linux"):
        return False
    return bool(inodes & socket_inodes(parent).keys())


def accepting_elsewhere(inodes: set[int]) -> bool:
    """Whether another child of this process's parent accepts on one of ``inodes``. True when
    ``/proc`` cannot tell: a worker that believes a sibling accepts leaves the queue to it."""
    if not sys.platform.startswith("linux"):
        return True
    parent, me = os.getppid(), os.getpid()
    try:
        entries = [entry.name for entry in _PROC.iterdir() if entry.name.isdigit()]
    except OSError:
        return True
    return any(
        int(name) != me and parent_of(int(name)) == parent and bool(inodes & _watched(name))
        for name in entries
    )


def _watched(pid: str) -> set[int]:
    """Inodes of the files ``pid``'s epoll sets watch for input (empty when unreadable)."""
    watched: set[int] = set()
    try:
        entries = list((_PROC / pid / "fd").iterdir())
    except OSError:
        return watched
    for entry in entries:
        try:
            if os.readlink(entry) != _EPOLL:
                continue
            info = (_PROC / pid / "fdinfo" / entry.name).read_text()
        except OSError:
            continue
        for events, inode in _WATCHED.findall(info):
            if int(events, 16) & _EPOLLIN:
                watched.add(int(inode, 16))
    return watched
