"""The listener helpers of the zero-loss stop, on real loopback sockets."""

from __future__ import annotations

import errno
import os
import select
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from forgezero_lifecycle.serve.sockets import accept_queue_length, refuse_new_connections
from forgezero_lifecycle.stop.sockets import unlink_unix_path

# The filter and the queue length exist on Linux only (elsewhere the helpers return False/None,
# which the last test checks on every platform); CI runs on Linux, where these always run.
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="SO_ATTACH_FILTER is Linux's")


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield sock
    finally:
        sock.close()


def _connect_nonblocking(address: tuple[str, int]) -> socket.socket:
    client = socket.socket()
    client.setblocking(False)
    assert client.connect_ex(address) in (0, errno.EINPROGRESS)
    return client


@linux_only
def test_queued_connections_counted(listener: socket.socket) -> None:
    """The accept queue's length is what waits to be accepted, and falls as it is accepted."""
    clients = [socket.create_connection(listener.getsockname()) for _ in range(3)]
    try:
        assert accept_queue_length(listener) == 3
        accepted, _ = listener.accept()
        accepted.close()
        assert accept_queue_length(listener) == 2
    finally:
        for client in clients:
            client.close()


@linux_only
def test_refusing_no_new_handshake(listener: socket.socket) -> None:
    """After the filter a new client's SYN is dropped: nothing reaches the accept queue."""
    assert refuse_new_connections(listener)
    client = _connect_nonblocking(listener.getsockname())
    try:
        # Writable means the handshake ended (either way); it must still be under way.
        _, writable, _ = select.select([], [client], [], 0.3)
        assert writable == []
        assert accept_queue_length(listener) == 0
    finally:
        client.close()


@linux_only
def test_queued_still_served(listener: socket.socket) -> None:
    """What was queued before the filter is still served: connections that completed their handshake
    before the filter exchange data as usual."""
    client = socket.create_connection(listener.getsockname())
    try:
        assert refuse_new_connections(listener)
        client.sendall(b"request")
        accepted, _ = listener.accept()
        with accepted:
            assert accepted.recv(16) == b"request"
            accepted.sendall(b"answer")
            assert client.recv(16) == b"answer"
    finally:
        client.close()


@linux_only
def test_waiter_refused_on_close() -> None:
    """A client waiting on a refusing listener is refused once it closes: the SYN the client
    retransmits after the close meets a closed port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    assert refuse_new_connections(listener)
    client = _connect_nonblocking(listener.getsockname())
    try:
        listener.close()
        _, writable, _ = select.select([], [client], [], 10.0)  # the retransmit comes after ~1 s
        assert writable == [client]
        assert client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNREFUSED
    finally:
        client.close()


def test_non_tcp_untouched() -> None:
    """A Unix socket has no SYN to drop and no TCP_INFO: both helpers say they cannot help."""
    left, right = socket.socketpair()
    with left, right:
        assert refuse_new_connections(left) is False
        assert accept_queue_length(left) is None


@linux_only
def test_unix_listener_queue_is_seen_and_its_path_removed(tmp_path: Path) -> None:
    """A unix listener's queue reads 1 while a connection waits and 0 once it is accepted;
    refusing new connections removes its path, so a new client cannot connect, while the
    queued one is still accepted."""
    path = str(tmp_path / "app.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    queued = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with listener, queued:
        assert accept_queue_length(listener) == 0
        queued.connect(path)
        assert accept_queue_length(listener) == 1
        assert refuse_new_connections(listener) is True
        assert not os.path.exists(path)
        late = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with late, pytest.raises(FileNotFoundError):
            late.connect(path)
        accepted, _ = listener.accept()
        accepted.close()
        assert accept_queue_length(listener) == 0


@linux_only
def test_unix_path_taken_over_is_left_alone(tmp_path: Path) -> None:
    """A path another socket was bound at since (a new server took it over) is not removed."""
    path = str(tmp_path / "app.sock")
    old = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old.bind(path)
    old.listen(8)
    os.unlink(path)
    new = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with old, new:
        new.bind(path)
        new.listen(8)
        assert unlink_unix_path(old) is False
        assert os.path.exists(path)
