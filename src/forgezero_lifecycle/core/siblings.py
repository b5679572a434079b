"""Is this process one of several workers accepting on the same listening socket?

Under ``uvicorn --workers N``, ``gunicorn -w N`` or ``hypercorn --workers N`` a parent binds the
listening socket and N children accept on it. A drain reaches only the child that received the
drain request, so it must never report ``drained`` for the whole server. This module finds the
siblings (Linux, through ``/proc``): the listening sockets among this process's descriptors, and
the other children of its parent that hold one of the same kernel sockets (same inode).

Elsewhere, or when ``/proc`` cannot be read, it finds none (and says nothing).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from ..stop.sockets import parent_of, socket_inodes

__all__ = ["listening_inodes", "shares_listener", "sibling_pids"]

_PROC = Path("/proc")


def listening_inodes() -> set[int]:
    """Inodes of this process's listening TCP sockets."""
    if not sys.platform.startswith("linux"):
        return set()
    listening: set[int] = set()
    for inode, fd in socket_inodes("self").items():
        try:
            probe = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if probe.type == socket.SOCK_STREAM and probe.getsockopt(
                socket.SOL_SOCKET, socket.SO_ACCEPTCONN
            ):
                listening.add(inode)
        except OSError:
            pass
        finally:
            probe.close()
    return listening


def sibling_pids() -> tuple[int, ...]:
    """Other children of this process's parent holding one of its listening sockets."""
    mine = listening_inodes()
    parent = os.getppid()
    if not mine or parent <= 1:
        return ()
    me = os.getpid()
    found: list[int] = []
    try:
        entries = [entry.name for entry in _PROC.iterdir() if entry.name.isdigit()]
    except OSError:
        return ()
    for name in entries:
        pid = int(name)
        if pid == me or parent_of(pid) != parent:
            continue
        if mine & socket_inodes(pid).keys():
            found.append(pid)
    return tuple(sorted(found))


def shares_listener(inodes: set[int]) -> bool:
    """Whether this process's parent, or another child of it, holds one of ``inodes`` (listening
    sockets of this process): a parent that bound the socket for its workers (``uvicorn
    --workers``, gunicorn's arbiter, ``serve --workers``) or a sibling worker accepting on it."""
    if not inodes or not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    if parent <= 1:
        return False
    if inodes & socket_inodes(parent).keys():
        return True
    me = os.getpid()
    try:
        entries = [entry.name for entry in _PROC.iterdir() if entry.name.isdigit()]
    except OSError:
        return False
    return any(
        int(name) != me
        and parent_of(int(name)) == parent
        and bool(inodes & socket_inodes(name).keys())
        for name in entries
    )
