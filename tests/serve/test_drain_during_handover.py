"""An orchestrator's drain that meets a handover, real ``serve --workers 2`` processes.

* A begin that reaches the retiring generation (sent on an old worker's connection before the
  switch, its body arriving after it) is refused: 409 ``RUNTIME_DRAIN_GENERATION_RETIRING``;
  sent again, on a new connection, it reaches the generation that serves.
* A begin accepted by the old generation before the switch (the handover follows that drain)
  keeps answering ``status?nonce=`` after the switch, from whichever worker the poll reaches,
  until the old generation is gone.

Before, the first drained only the retiring generation, and every poll of either drain that
reached the new generation answered 404.

The handover is held at a known point with the app's ``stagger`` mode, written for the new
generation only: its first worker is ready at once, its second 3 s later, and the switch waits
for both. A begin sent once the first new worker recorded ``started`` reaches generation 1.
"""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from .conftest import AUTH, StartSupervised, Supervised
from .test_generation_drain import BEGIN, REVISION, STATUS, _request

pytestmark = pytest.mark.server


def _start_held_handover(start_supervised: StartSupervised, tmp_path: Path) -> Supervised:
    """``serve --workers 2``, then a SIGHUP whose new generation's second worker is 3 s late;
    returns once the new generation's first worker started (the switch is then ~3 s away)."""
    mode_file = tmp_path / "mode"
    mode_file.write_text("ok")
    served = start_supervised(
        "--revision", REVISION, "--handover-grace", "2s", "--drain-timeout", "10s",
        workers=2, env={"FZW_MODE_FILE": str(mode_file)},
    )  # fmt: skip
    old = set(served.worker_records())
    mode_file.write_text("stagger")
    served.signal(signal.SIGHUP)
    served.wait_for(
        lambda: any(
            "started" in lines for pid, lines in served.worker_records().items() if pid not in old
        ),
        "the new generation's first worker started",
    )
    assert "supervisor.new_generation_ready" not in served.log()
    return served


def _poll(served: Supervised, nonce: str) -> tuple[int, dict[str, Any]]:
    answer = served.get(STATUS, params={"nonce": nonce}, headers=AUTH)
    return answer.status_code, answer.json()


def test_begin_reaching_retiring_generation_refused(
    start_supervised: StartSupervised, tmp_path: Path
) -> None:
    """A begin whose body reaches an old worker after the switch is refused (409), and no
    drain begins; the same begin on a new connection then drains the new generation."""
    served = _start_held_handover(start_supervised, tmp_path)
    request = _request(10_000)
    body = json.dumps(request).encode()
    url = urlsplit(served.url)
    # The body timer of the control plane (5 s) starts with the headers; the switch comes about
    # 3 s after the new generation's first worker started: a margin of about 2 s.
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(
            f"POST {BEGIN} HTTP/1.1\r\nHost: 127.0.0.1:{url.port}\r\n"
            f"Authorization: {AUTH['Authorization']}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        served.wait_log("supervisor.new_generation_ready generation=2", bound=10)
        sock.sendall(body)
        answer = _read_response(sock)
    assert answer["status"] == 409, answer
    assert answer["body"]["error"] == "RUNTIME_DRAIN_GENERATION_RETIRING", answer
    assert "generation 2" in answer["body"]["detail"]
    assert _poll(served, request["nonce"])[0] == 404  # nothing began
    served.wait_log("supervisor.handover_done from=1 to=2")
    assert served.post(BEGIN, request).status_code == 202  # the generation that serves
    served.wait_for(lambda: _poll(served, request["nonce"])[1]["status"] == "drained", "drained")
    assert _poll(served, request["nonce"])[1]["detail"]["generation"] == 2


def test_drain_begun_before_switch_answers_after_it(
    start_supervised: StartSupervised, tmp_path: Path
) -> None:
    """A drain of generation 1 begun while generation 2 starts: the handover follows it, and
    its status answers from generation 2's workers too until generation 1 is gone."""
    served = _start_held_handover(start_supervised, tmp_path)
    request = _request(10_000)
    assert served.post(BEGIN, request).status_code == 202
    served.wait_log("supervisor.new_generation_ready generation=2", bound=10)
    for _ in range(6):  # new connections: the kernel hands each to a worker of generation 2
        status, document = _poll(served, request["nonce"])
        assert status == 200, document
        assert document["detail"]["generation"] == 1
    served.wait_log("supervisor.handover_done from=1 to=2")
    served.wait_for(lambda: _poll(served, request["nonce"])[0] == 404, "forgotten with g1")


def _read_response(sock: socket.socket) -> dict[str, Any]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, rest
        rest += chunk
    return {"status": int(lines[0].split()[1]), "body": json.loads(rest[:length])}
