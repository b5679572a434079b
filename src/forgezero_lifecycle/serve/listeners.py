"""The supervisor's listening sockets: bound once here, or handed over by systemd.

A supervisor holds its listening sockets for as long as it lives and passes them to every worker
it starts. They are bound without ``SO_REUSEPORT`` (one kernel socket and one accept queue,
shared by every generation) and never accepted on, shut down or closed while a generation runs.

systemd socket activation (``sd_listen_fds(3)``): when ``LISTEN_PID`` is this process and
``LISTEN_FDS`` is N, file descriptors 3 … 3+N-1 are listening sockets, named by
``LISTEN_FDNAMES`` (colon separated). The three variables are removed from the environment once
read, so the workers never mistake them for their own.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Final, final

from .._errors import ConfigurationError

__all__ = ["BACKLOG", "Listener", "bind_listener", "held_listeners", "systemd_listeners"]

#: The accept queue of a socket the supervisor binds: it outlives every generation.
BACKLOG: Final = 2048
#: The first file descriptor systemd passes (``SD_LISTEN_FDS_START``).
LISTEN_FDS_START: Final = 3
_LISTEN_VARIABLES: Final = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


@final
@dataclass(frozen=True, slots=True)
class Listener:
    """One held listening socket and where it came from (``bound`` or ``systemd``)."""

    sock: socket.socket
    name: str
    origin: str

    def describe(self) -> str:
        address = self.sock.getsockname()
        where = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
        return f"{where} ({self.origin}, fd {self.sock.fileno()}, name {self.name})"


def bind_listener(host: str, port: int, *, backlog: int = BACKLOG) -> socket.socket:
    """A TCP listening socket on ``host:port`` (``SO_REUSEADDR``, never ``SO_REUSEPORT``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as error:
        sock.close()
        raise ConfigurationError(
            detail=f"cannot listen on {host}:{port}: {error.strerror or error}"
        ) from None
    return sock


def systemd_listeners(environ: MutableMapping[str, str] | None = None) -> list[Listener] | None:
    """The sockets systemd passed this process, or None when it passed none.

    A ``LISTEN_PID`` naming another process means the variables were meant for a parent: they
    are ignored (and left alone). Anything else malformed is a clear configuration error.
    """
    env = os.environ if environ is None else environ
    if "LISTEN_FDS" not in env:
        return None
    pid_text = env.get("LISTEN_PID", "")
    if pid_text and pid_text.isdigit() and int(pid_text) != os.getpid():
        return None
    count_text = env["LISTEN_FDS"]
    if not count_text.isdigit() or not pid_text.isdigit():
        raise ConfigurationError(
            detail=f"LISTEN_FDS={count_text!r} / LISTEN_PID={pid_text!r} are not numbers"
        )
    count = int(count_text)
    names = env.get("LISTEN_FDNAMES", "").split(":") if env.get("LISTEN_FDNAMES") else []
    for variable in _LISTEN_VARIABLES:
        env.pop(variable, None)
    listeners: list[Listener] = []
    for offset in range(count):
        fd = LISTEN_FDS_START + offset
        name = names[offset] if offset < len(names) else f"fd{fd}"
        listeners.append(Listener(_listening_socket(fd), name, "systemd"))
    return listeners


def _listening_socket(fd: int) -> socket.socket:
    try:
        sock = socket.socket(fileno=fd)
    except OSError as error:
        raise ConfigurationError(
            detail=f"LISTEN_FDS names fd {fd}, which is not a socket ({error.strerror or error})"
        ) from None
    accepting = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    if sock.type != socket.SOCK_STREAM or not accepting:
        sock.detach()
        raise ConfigurationError(detail=f"fd {fd} is not a listening stream socket")
    os.set_inheritable(fd, False)  # passed to workers explicitly, never by accident
    return sock


def held_listeners(host: str, port: int) -> list[Listener]:
    """systemd's sockets when it passed some, else one socket bound on ``host:port``."""
    inherited = systemd_listeners()
    if inherited:
        return inherited
    return [Listener(bind_listener(host, port), f"{host}:{port}", "bound")]
