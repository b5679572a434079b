"""The supervisor's listening sockets: bound once here, or handed over by systemd.

``--uds PATH`` binds a unix socket instead of ``--host``/``--port`` (a stale socket file nobody
listens on is replaced, one in use is refused; the file is made ``0o666``, as uvicorn makes it),
and ``--fd N`` takes the socket of an inherited descriptor (a process manager's). Plain ``serve``
binds them the same way (:func:`own_listeners`), so its stop knows the socket it owns.

A supervisor holds its listening sockets for as long as it lives and passes them to every worker
it starts. They are bound without ``SO_REUSEPORT`` (one kernel socket and one accept queue,
shared by every generation) and never accepted on, shut down or closed while a generation runs.

systemd socket activation (``sd_listen_fds(3)``): when ``LISTEN_PID`` is this process and
``LISTEN_FDS`` is N, file descriptors 3 … 3+N-1 are listening sockets, named by
``LISTEN_FDNAMES`` (colon separated). The three variables are removed from the environment once
read, so the workers never mistake them for their own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Final, final

from .._errors import ConfigurationError
from ..stop.sockets import accept_new_connections, unlink_unix_path

__all__ = [
    "BACKLOG",
    "Listener",
    "bind_listener",
    "bind_unix_listener",
    "fd_listener",
    "held_listeners",
    "own_listeners",
    "systemd_listeners",
]

logger = logging.getLogger("forgezero_lifecycle.serve")

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
        if isinstance(address, tuple):
            where = f"{address[0]}:{address[1]}"
        elif self.sock.family == socket.AF_UNIX:
            where = f"unix:{address}"
        else:
            where = str(address)
        return f"{where} ({self.origin}, fd {self.sock.fileno()}, name {self.name})"

    def close(self) -> None:
        """Close the socket; a ``--uds`` socket's path is removed first if it still names it
        (the stop removes it already, unless the stop failed)."""
        if self.origin == "uds":
            unlink_unix_path(self.sock)
        self.sock.close()


def bind_listener(host: str, port: int, *, backlog: int = BACKLOG) -> socket.socket:
    """A TCP listening socket on ``host:port`` (``SO_REUSEADDR``, never ``SO_REUSEPORT``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)

    def bind() -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))

    return _listening(sock, bind, backlog, f"cannot listen on {host}:{port}")


def _listening(
    sock: socket.socket, bind: Callable[[], None], backlog: int, failure: str
) -> socket.socket:
    """``sock`` bound by ``bind`` and listening; closed and refused if either fails."""
    try:
        bind()
        sock.listen(backlog)
    except OSError as error:
        sock.close()
        raise ConfigurationError(detail=f"{failure}: {error.strerror or error}") from None
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


def _listening_socket(
    fd: int, *, source: str = "LISTEN_FDS", backlog: int | None = None
) -> socket.socket:
    """The stream socket of descriptor ``fd``, listening; ``backlog``: a bound socket that does
    not listen yet is made to (uvicorn's ``--fd`` calls ``listen`` on it too), else refused."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as error:
        raise ConfigurationError(
            detail=f"{source} names fd {fd}, which is not a socket ({error.strerror or error})"
        ) from None
    try:
        if sock.type != socket.SOCK_STREAM:
            raise ConfigurationError(detail=f"{source}: fd {fd} is not a listening stream socket")
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            if backlog is None:
                raise ConfigurationError(
                    detail=f"{source}: fd {fd} is not a listening stream socket"
                )
            try:
                sock.listen(backlog)
            except OSError as error:
                raise ConfigurationError(
                    detail=f"{source}: fd {fd} cannot listen ({error.strerror or error})"
                ) from None
    except ConfigurationError:
        sock.detach()  # the descriptor stays its owner's
        raise
    if accept_new_connections(sock):  # a previous serve's stop left its filter on it
        logger.info("listeners.syn_filter_removed fd=%d", fd)
    os.set_inheritable(fd, False)  # passed to workers explicitly, never by accident
    return sock


def bind_unix_listener(path: str, *, backlog: int = BACKLOG) -> socket.socket:
    """A unix listening socket at ``path`` (``--uds``), mode ``0o666`` as uvicorn's.

    A socket file left behind by a server that is gone is replaced; one a server still listens
    on is refused (uvicorn's own bind would take the path from it).
    """
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise ConfigurationError(detail=f"--uds {path}: exists and is not a socket")
        if _listened_on(path):
            raise ConfigurationError(detail=f"--uds {path}: a server listens on it already")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def bind() -> None:
        sock.bind(path)
        os.chmod(path, 0o666)

    return _listening(sock, bind, backlog, f"--uds {path}: cannot listen")


def _listened_on(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def fd_listener(fd: int, *, backlog: int = BACKLOG) -> socket.socket:
    """The listening stream socket of inherited descriptor ``fd`` (``--fd``)."""
    return _listening_socket(fd, source="--fd", backlog=backlog)


def own_listeners(
    *, uds: str | None = None, fd: int | None = None, backlog: int = BACKLOG
) -> list[Listener] | None:
    """The sockets given to this process (systemd's, ``--uds``, ``--fd``), or None: bind
    ``--host``/``--port`` (plain ``serve`` leaves that to uvicorn)."""
    inherited = systemd_listeners()
    if inherited and (uds is not None or fd is not None):
        for listener in inherited:
            listener.sock.close()
        flag = "--uds" if uds is not None else "--fd"
        raise ConfigurationError(
            detail=f"systemd passed sockets (LISTEN_FDS) and {flag} names another: give one"
        )
    if inherited:
        return inherited
    if uds is not None:
        return [Listener(bind_unix_listener(uds, backlog=backlog), uds, "uds")]
    if fd is not None:
        return [Listener(fd_listener(fd, backlog=backlog), f"fd{fd}", "fd")]
    return None


def held_listeners(
    host: str,
    port: int,
    *,
    uds: str | None = None,
    fd: int | None = None,
    backlog: int = BACKLOG,
) -> list[Listener]:
    """systemd's sockets when it passed some, ``--uds``'s or ``--fd``'s, else one socket bound
    on ``host:port``."""
    given = own_listeners(uds=uds, fd=fd, backlog=backlog)
    if given:
        return given
    return [Listener(bind_listener(host, port, backlog=backlog), f"{host}:{port}", "bound")]
