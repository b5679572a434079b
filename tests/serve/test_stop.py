"""The stop of a ``serve``d process at the level of single connections (raw sockets).

The load test (``tests/reliability/test_zero_loss_stop.py``) shows the whole; these pin each
rule on one connection: a request that arrives during the stop on a connection accepted before
it is answered, and a response that started before a drain closes its connection after it ends.
"""

from __future__ import annotations

import json
import secrets
import signal
import socket
import time
from typing import Final

import pytest

from tests.cli.conftest import CONTROL_TOKEN, REVISION_A, REVISION_B, Served, StartServe

pytestmark = pytest.mark.server

REFUSAL: Final = b'{"error":"RUNTIME_DRAINING"}'
BOUND: Final = 20.0


def _connect(served: Served) -> socket.socket:
    host, _, port = served.url.removeprefix("http://").partition(":")
    client = socket.create_connection((host, int(port)), timeout=BOUND)
    return client


def _wait_until_the_port_refuses(served: Served) -> None:
    """The stop has closed the listener: a new connection is refused (not left hanging)."""
    host, _, port = served.url.removeprefix("http://").partition(":")
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=0.2).close()
        except ConnectionRefusedError:
            return
        except TimeoutError:
            pass  # the listener drops new handshakes while it takes what was queued
        time.sleep(0.02)
    raise AssertionError(f"the port still accepts after {BOUND} s:\n{served.log()}")


def _read_response(client: socket.socket) -> tuple[bytes, bytes]:
    """One HTTP/1.1 response with a Content-Length: (head, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = client.recv(65536)
        assert chunk, f"the connection ended without an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = client.recv(65536)
        assert chunk, "the connection ended inside the body"
        body += chunk
    return head, body


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n".encode()


def _begin_drain(client: socket.socket) -> None:
    body = json.dumps(
        {
            "protocol": "forgezero-drain/v1",
            "nonce": secrets.token_urlsafe(32),
            "sourceRevision": REVISION_A,
            "targetRevision": REVISION_B,
            "timeoutMs": 10_000,
        }
    ).encode()
    client.sendall(
        b"POST /.forgezero/runtime/drain/v1/begin HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        + f"authorization: Bearer {CONTROL_TOKEN}\r\ncontent-type: application/json\r\n".encode()
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    head, _ = _read_response(client)
    assert head.startswith(b"HTTP/1.1 202"), head


def test_late_request_answered(
    start_serve: StartServe,
) -> None:
    """A request sent late on a connection accepted before the stop is answered: uvicorn alone
    closes a connection whose request it has not read at once; serve waits."""
    served = start_serve("tests.cli.apps:app", "--first-byte-grace", "5s")
    client = _connect(served)
    with client:
        served.signal(signal.SIGTERM)
        _wait_until_the_port_refuses(served)
        client.sendall(_get("/fast"))
        head, body = _read_response(client)
        assert head.startswith(b"HTTP/1.1 503"), head
        assert b"connection: close" in head.lower()
        assert body == REFUSAL
        assert client.recv(1) == b""  # then a clean close, never a reset
    assert served.wait_exit() == 0


def test_started_response_closes(
    start_serve: StartServe,
) -> None:
    """A response started before the drain closes its connection: it cannot carry Connection: close
    any more, so the server closes after it instead."""
    served = start_serve("tests.cli.apps:app")
    client = _connect(served)
    with client, _connect(served) as control:
        client.sendall(_get("/stream?seconds=1"))
        served.wait_admitted()
        assert client.recv(65536).startswith(b"HTTP/1.1 200")  # the response has started
        _begin_drain(control)
        rest = b""
        client.settimeout(3.0)  # below uvicorn's keep-alive timeout (5 s), which would close it too
        while chunk := client.recv(65536):
            rest += chunk
        assert rest.endswith(b"last\n\r\n0\r\n\r\n"), rest  # the whole response, then the close
