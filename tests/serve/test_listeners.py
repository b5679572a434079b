"""Listening sockets the supervisor holds: bound once, or taken from systemd's variables."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from forgezero_lifecycle._errors import ConfigurationError
from forgezero_lifecycle.serve.listeners import (
    bind_listener,
    bind_unix_listener,
    fd_listener,
    systemd_listeners,
)
from forgezero_lifecycle.stop.sockets import refuse_new_connections


def test_listener_no_reuseport() -> None:
    """One kernel socket per port: SO_REUSEPORT stays off, so a second bind fails clearly."""
    sock = bind_listener("127.0.0.1", 0)
    try:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 0
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        port = sock.getsockname()[1]
        with pytest.raises(ConfigurationError, match=f"cannot listen on 127.0.0.1:{port}"):
            bind_listener("127.0.0.1", port)
    finally:
        sock.close()


def test_no_listen_fds() -> None:
    """No LISTEN_FDS means no socket activation."""
    assert systemd_listeners({}) is None


def test_other_listen_pid_ignored() -> None:
    """LISTEN_PID of another process is ignored and left alone: the variables were meant for a
    parent, not ours to take, not ours to remove."""
    env = {"LISTEN_FDS": "1", "LISTEN_PID": str(os.getpid() + 1)}
    assert systemd_listeners(env) is None
    assert env == {"LISTEN_FDS": "1", "LISTEN_PID": str(os.getpid() + 1)}


def test_malformed_variables_error() -> None:
    """Malformed variables are a configuration error."""
    with pytest.raises(ConfigurationError, match="not numbers"):
        systemd_listeners({"LISTEN_FDS": "one", "LISTEN_PID": str(os.getpid())})


def test_non_listening_fd_refused() -> None:
    """fd 3 holding a connected (not listening) socket: refused, and left open."""
    left, right = socket.socketpair()
    with left, right, _at_fd_3(left):
        env = {"LISTEN_FDS": "1", "LISTEN_PID": str(os.getpid())}
        with pytest.raises(ConfigurationError, match="fd 3 is not a listening stream socket"):
            systemd_listeners(env)
        assert _is_open(3)


def test_activated_sockets_taken() -> None:
    """Activated sockets are taken with their names, and the variables are removed."""
    listening = socket.create_server(("127.0.0.1", 0))
    with listening, _at_fd_3(listening):
        env = {"LISTEN_FDS": "1", "LISTEN_PID": str(os.getpid()), "LISTEN_FDNAMES": "http"}
        found = systemd_listeners(env)
        assert found is not None
        assert [(listener.name, listener.origin) for listener in found] == [("http", "systemd")]
        assert found[0].sock.getsockname() == listening.getsockname()
        assert "(systemd, fd 3, name http)" in found[0].describe()
        assert env == {}
        found[0].sock.detach()  # fd 3 is restored by _at_fd_3


@contextlib.contextmanager
def _at_fd_3(sock: socket.socket) -> Iterator[None]:
    """``sock`` duplicated onto fd 3, as systemd passes it; fd 3 as it was afterwards."""
    saved = os.dup(3) if _is_open(3) else None
    os.dup2(sock.fileno(), 3)
    try:
        yield
    finally:
        if saved is not None:
            os.dup2(saved, 3)
            os.close(saved)
        else:
            os.close(3)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _connects_within(address: tuple[str, int], seconds: float) -> bool:
    """Whether a TCP handshake to ``address`` completes within ``seconds`` (a dropped SYN is
    retransmitted only after about a second)."""
    client = socket.socket()
    client.setblocking(False)
    try:
        client.connect_ex(address)
        _, writable, _ = select.select([], [client], [], seconds)
        return bool(writable) and client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    finally:
        client.close()


@pytest.mark.skipif(sys.platform != "linux", reason="SO_ATTACH_FILTER is Linux's")
def test_inherited_listener_accepts_new_connections_again() -> None:
    """A socket a previous serve stopped on (new handshakes dropped by its filter) and its
    owner kept, handed over with ``--fd``: taken, and new clients connect again."""
    owner = bind_listener("127.0.0.1", 0)
    with owner:
        assert refuse_new_connections(owner)
        assert not _connects_within(owner.getsockname(), 0.3)
        taken = fd_listener(os.dup(owner.fileno()))
        with taken:
            assert _connects_within(owner.getsockname(), 5.0)


def test_fd_listener_refuses_what_is_no_stream_socket(tmp_path: Path) -> None:
    """``--fd`` naming a file or a datagram socket: refused, and the descriptor left open."""
    with (tmp_path / "file").open("w") as file:
        with pytest.raises(ConfigurationError, match="not a socket"):
            fd_listener(file.fileno())
        assert _is_open(file.fileno())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as datagram:
        with pytest.raises(ConfigurationError, match="not a listening stream socket"):
            fd_listener(datagram.fileno())
        assert _is_open(datagram.fileno())


def test_uds_listener_replaces_a_stale_socket_file(tmp_path: Path) -> None:
    """``--uds`` at a socket file nobody listens on (a server that is gone): replaced, and
    the new socket is reachable, mode 0o666 as uvicorn's."""
    path = tmp_path / "app.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    with bind_unix_listener(str(path)) as sock:
        assert path.stat().st_mode & 0o777 == 0o666
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))
            sock.accept()[0].close()
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigurationError, match="not a socket"):
        bind_unix_listener(str(tmp_path / "file"))
