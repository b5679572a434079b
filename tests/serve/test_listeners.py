"""Listening sockets the supervisor holds: bound once, or taken from systemd's variables."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

import pytest

from forgezero_lifecycle._errors import ConfigurationError
from forgezero_lifecycle.serve.listeners import bind_listener, systemd_listeners


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
