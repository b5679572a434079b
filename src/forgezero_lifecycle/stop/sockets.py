"""Listening sockets at the end of their life: refuse new handshakes, see what is still queued.

Closing a listening socket resets every connection still waiting in its accept queue: the client
has completed its handshake, may have sent its request, and then meets a reset it cannot tell
from a crash. The stop therefore goes in three steps (:func:`forgezero_lifecycle.stop.server.zero_loss_shutdown`):

1. :func:`refuse_new_connections` attaches a classic BPF socket filter that drops every new SYN
   while letting the rest through, so handshakes already under way still complete and new
   clients retransmit their SYN (after about a second, RFC 6298 §2) instead of being accepted;
2. the server keeps accepting until :func:`accept_queue_length` says the queue is empty, and
   answers what it took;
3. only then is the listener closed: the clients' retransmitted SYNs meet a closed port and get
   "connection refused", which any client may retry because nothing was sent.

A unix socket (``serve --uds``) has no handshake to filter: step 1 removes its path instead
(:func:`unlink_unix_path`), so a new client's ``connect`` fails with "no such file" before it
sends anything, while the connections already queued stay to be accepted; its queue is known
only to be empty or not (the listener is readable while a connection waits).

Both helpers are Linux-only (``SO_ATTACH_FILTER``, ``TCP_INFO`` of a listener, ``/proc/net/unix``);
elsewhere they report that they cannot help, and the stop closes the listener as every other
server does.

Which processes hold, and which accept on, a listening socket is read from Linux's ``/proc``
(:func:`accepting_elsewhere`, :func:`parent_holds`): a process holds a kernel socket while one of
its descriptors refers to it (``/proc/<pid>/fd`` links read ``socket:[<inode>]``); it accepts on a
listener while its event loop's epoll set watches the listener for input:
``/proc/<pid>/fdinfo/<epoll fd>`` has one ``tfd:`` line per watched descriptor, with its events
and the inode of its file (``fs/eventpoll.c``). asyncio's selector and libuv (uvloop) both
register a serving listener that way and remove it when they stop serving it. Elsewhere, or when
``/proc`` cannot be read, nothing is found.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import select
import socket
import struct
import sys
from pathlib import Path
from typing import Final, Protocol

__all__ = [
    "accept_new_connections",
    "accept_queue_length",
    "accepting_elsewhere",
    "parent_holds",
    "parent_of",
    "refuse_new_connections",
    "socket_inodes",
    "unlink_unix_path",
]


_SO_ATTACH_FILTER: Final = 26
_SO_DETACH_FILTER: Final = 27
#: The flag of a listening socket in ``/proc/net/unix``.
_SO_ACCEPTCON: Final = 0x10000
#: ``struct tcp_info``: eight one-byte fields, then ``tcpi_rto, ato, snd_mss, rcv_mss, unacked``.
#: For a listening socket the kernel reports its accept queue's length in ``tcpi_unacked``.
_TCPI_UNACKED_OFFSET: Final = 24
_TCP_INFO_SIZE: Final = 104

# A classic BPF program run on each segment the listener receives, at the TCP header:
#   ldb [13]                 the flags byte
#   jset #0x10, accept       ACK set: a handshake being completed, or data
#   jset #0x02, drop         SYN without ACK: a new connection
#   accept
_BPF_LD_B_ABS: Final = 0x30
_BPF_JSET_K: Final = 0x45
_BPF_RET_K: Final = 0x06
_TCP_FLAGS_OFFSET: Final = 13
_TCP_ACK: Final = 0x10
_TCP_SYN: Final = 0x02
_DROP_NEW_SYNS: Final = (
    (_BPF_LD_B_ABS, 0, 0, _TCP_FLAGS_OFFSET),
    (_BPF_JSET_K, 2, 0, _TCP_ACK),
    (_BPF_JSET_K, 0, 1, _TCP_SYN),
    (_BPF_RET_K, 0, 0, 0),
    (_BPF_RET_K, 0, 0, 0xFFFFFFFF),
)
_PROGRAM: Final = ctypes.create_string_buffer(
    b"".join(struct.pack("HBBI", *instruction) for instruction in _DROP_NEW_SYNS)
)
#: ``struct sock_fprog``: the instruction count, then a pointer to the program (kept alive above).
_FPROG: Final = struct.pack("HL", len(_DROP_NEW_SYNS), ctypes.addressof(_PROGRAM))


class ListeningSocket(Protocol):
    """What the helpers need of a socket: ``socket.socket`` and asyncio's ``TransportSocket``."""

    @property
    def family(self) -> int: ...

    def fileno(self) -> int: ...

    def getsockname(self) -> object: ...

    def getsockopt(self, level: int, option: int, buffersize: int, /) -> bytes: ...

    def setsockopt(self, level: int, option: int, value: bytes, /) -> None: ...


def _is_tcp(sock: ListeningSocket) -> bool:
    return sys.platform == "linux" and sock.family in (socket.AF_INET, socket.AF_INET6)


def _is_unix(sock: ListeningSocket) -> bool:
    return sys.platform == "linux" and sock.family == socket.AF_UNIX


def unlink_unix_path(sock: ListeningSocket) -> bool:
    """Remove the path of unix listener ``sock`` if it still names this socket: no other
    socket is bound at it (``/proc/net/unix``), so a later server that took the path over keeps
    it. Returns whether new connections can no longer reach ``sock``."""
    if not _is_unix(sock):
        return False
    try:
        path = sock.getsockname()
        inode = os.fstat(sock.fileno()).st_ino
        table = Path("/proc/net/unix").read_text(errors="replace").splitlines()[1:]
    except (OSError, ValueError):  # closed already
        return False
    if not isinstance(path, str) or not path:  # unnamed, or the abstract namespace
        return False
    # Listening sockets (``__SO_ACCEPTCON`` in the flags) bound at the path; the accepted
    # connections' sockets carry the path too, and are not among them.
    bound = [
        fields[6]
        for line in table
        if len(fields := line.split(None, 7)) == 8
        and fields[7] == path
        and int(fields[3], 16) & _SO_ACCEPTCON
    ]
    if bound != [str(inode)]:
        return False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return True


def refuse_new_connections(sock: ListeningSocket) -> bool:
    """Drop new SYNs to ``sock`` from now on (handshakes under way still complete).

    Returns False where the platform or the socket's family cannot do it. Affects the kernel
    socket, so every process that holds it: use it only on a listener nobody else serves. A
    unix listener's path is removed instead (:func:`unlink_unix_path`).
    """
    if _is_unix(sock):
        return unlink_unix_path(sock)
    if not _is_tcp(sock):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, _FPROG)
    except OSError:
        return False
    return True


def accept_new_connections(sock: ListeningSocket) -> bool:
    """Undo :func:`refuse_new_connections`: remove a socket filter from ``sock``.

    For a listener this process is handed (systemd's, ``--fd``): the process that held it
    before may have stopped on it, leaving new handshakes dropped, and whoever passed it on
    (systemd keeps its sockets across restarts) kept it so. Returns whether a filter was removed.
    """
    if not _is_tcp(sock):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_DETACH_FILTER, b"\0\0\0\0")
    except OSError:
        return False  # none attached (ENOENT)
    return True


def accept_queue_length(sock: ListeningSocket) -> int | None:
    """Connections that completed their handshake and wait to be accepted, or None if unknown
    (a unix listener's: 1 while one or more wait, else 0)."""
    if _is_unix(sock):
        try:
            listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN, 4)
            readable, _, _ = select.select([sock.fileno()], [], [], 0)
        except (OSError, ValueError):
            return None
        if not struct.unpack("i", listening)[0]:
            return None  # not a listener: no queue
        return 1 if readable else 0
    if not _is_tcp(sock):
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
    except OSError:
        return None
    if len(info) < _TCPI_UNACKED_OFFSET + 4:
        return None
    (queued,) = struct.unpack_from("I", info, _TCPI_UNACKED_OFFSET)
    return int(queued)


# Who else holds a listening socket, as /proc tells it.


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
