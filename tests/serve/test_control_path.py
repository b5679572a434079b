"""The generation-wide control paths under real ``serve --workers 2`` processes: hostile requests
are answered in the worker, and no worker is lost to one."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import httpx
import pytest

from forgezero_lifecycle.core._httpx import tls_context

from .conftest import AUTH, BOUND, StartSupervised

pytestmark = pytest.mark.server

PREFIX = "/.forgezero/runtime/"


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    return parts.hostname, parts.port


def _head_of_answer(sock: socket.socket) -> bytes:
    """Read until the end of the response's head (bounded by the socket's timeout)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_huge_header_costs_no_worker(start_supervised: StartSupervised) -> None:
    """Three requests with a 5 MiB header of 0xFF bytes: each is refused, every worker lives on
    and the channel never carries them (a forwarded copy was over its limit: the worker that
    sent it took the supervisor for gone and exited)."""
    served = start_supervised(workers=2)
    before = set(served.workers())
    host, port = _address(served.url)
    junk = b"\xff" * (5 << 20)
    for _ in range(3):
        with socket.create_connection((host, port), timeout=BOUND) as sock:
            sock.sendall(
                b"GET " + PREFIX.encode() + b"drain/v1/current HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"X-Junk: " + junk + b"\r\nConnection: close\r\n\r\n"
            )
            head = _head_of_answer(sock)
        assert head.startswith(b"HTTP/1.1 4"), head[:80]
    assert served.get("/.forgezero/runtime/ready").status_code == 200
    assert set(served.workers()) == before, served.log()
    log = served.log()
    assert "channel.oversized" not in log
    assert "worker_lost" not in log


def test_unread_body_answered(
    start_supervised: StartSupervised,
) -> None:
    """A begin that declares a body and never sends it gets its 401 at once: the worker no longer
    reads a body (without a time bound) before it authenticates."""
    served = start_supervised(workers=2)
    host, port = _address(served.url)
    with socket.create_connection((host, port), timeout=BOUND) as sock:
        sock.sendall(
            b"POST " + PREFIX.encode() + b"drain/v1/begin HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
        )
        head = _head_of_answer(sock)
    assert head.startswith(b"HTTP/1.1 401"), head[:80]


def test_5000_digit_handover_404(start_supervised: StartSupervised) -> None:
    """A handover number of 5,000 digits is not found (404), with no traceback in the log."""
    served = start_supervised(workers=2)
    answer = served.get(PREFIX + "supervisor/v1/handover?handover=" + "9" * 5000, headers=AUTH)
    assert (answer.status_code, answer.json()["error"]) == (404, "RUNTIME_NOT_FOUND")
    assert "Traceback" not in served.log()


def test_rebound_reload_refused(
    start_supervised: StartSupervised,
) -> None:
    """``--insecure-loopback-control``: a POST with ``Host: evil.example`` and a ``text/plain``
    body, as a DNS-rebound page sends it, begins no handover; a loopback client may."""
    served = start_supervised(
        "--insecure-loopback-control",
        workers=2,
        target="tests.serve.plain_app:app",
        env={"FORGEZERO_CONTROL_TOKEN": ""},
    )
    reload = served.url + PREFIX + "supervisor/v1/reload"
    rebound = httpx.post(
        reload,
        content=b"",
        headers={"host": "evil.example", "content-type": "text/plain"},
        trust_env=False,
        timeout=BOUND,
        verify=tls_context(),
    )
    assert (rebound.status_code, rebound.json()["error"]) == (401, "RUNTIME_UNAUTHORIZED")
    plain = httpx.post(
        reload,
        content=b"",
        headers={"content-type": "text/plain"},
        trust_env=False,
        verify=tls_context(),
    )
    assert (plain.status_code, plain.json()["error"]) == (415, "RUNTIME_CONTENT_TYPE")
    latest = httpx.get(
        served.url + PREFIX + "supervisor/v1/handover", trust_env=False, verify=tls_context()
    )
    assert (latest.status_code, latest.json()["detail"]) == (404, "no handover has begun")
    accepted = httpx.post(reload, json={}, trust_env=False, timeout=BOUND, verify=tls_context())
    assert accepted.status_code == 202, accepted.text
    served.wait_log("supervisor.handover_done from=1 to=2")
