"""What the CLI reads (token files, the environment) and what it prints of a server's text."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from forgezero_lifecycle.client import new_nonce

from ._run import run
from .conftest import CONTROL_TOKEN, REVISION_A, REVISION_B, free_port

REVISIONS = ("--source-revision", REVISION_A, "--target-revision", REVISION_B)
ESCAPES = "\x1b[2J\x1b]0;owned\x07\u202e\x9b31m"


@pytest.fixture
def closed_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def token_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_two_line_token_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, closed_url: str
) -> None:
    """A token file with two lines is a usage error: the newline inside the token is named as such
    (exit 2), not reported as unreachable."""
    path = token_file(tmp_path, CONTROL_TOKEN + "\nsecond-line-of-the-file\n")
    result = run(
        capsys, "status", "--url", closed_url, "--nonce=" + new_nonce(), "--token-file", str(path)
    )
    assert result.code == 2, result
    assert "more than one line" in result.err
    assert "UNREACHABLE" not in result.err
    assert "second-line" not in result.err


def test_non_ascii_token_unleaked(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, closed_url: str
) -> None:
    """A non-ASCII token is refused without leaking it: no character of a token a header cannot
    carry appears in the message."""
    monkeypatch.setenv("FORGEZERO_CONTROL_TOKEN", "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzé")
    result = run(capsys, "status", "--url", closed_url, "--nonce=" + new_nonce())
    assert result.code == 2, result
    assert "é" not in result.err
    assert "zzzz" not in result.err
    assert "FORGEZERO_CONTROL_TOKEN" in result.err


def test_readable_token_file_warned(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, closed_url: str
) -> None:
    """A token file others can read is warned about: mode 0644 gets a warning naming chmod 600; mode
    0600 gets none."""
    shared = token_file(tmp_path, CONTROL_TOKEN + "\n", mode=0o644)
    argv = ("drain", "--url", closed_url, *REVISIONS, "--retries", "0")
    warned = run(capsys, *argv, "--token-file", str(shared))
    assert "warning" in warned.err
    assert "chmod 600" in warned.err
    shared.chmod(0o600)
    quiet = run(capsys, *argv, "--token-file", str(shared))
    assert "warning" not in quiet.err
    assert quiet.code == warned.code == 3


@pytest.fixture
def hostile_server() -> Iterator[str]:
    """A loopback server whose error details and failure texts carry terminal escapes."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if "status" in self.path:
                nonce = self.path.split("nonce=")[1]
                body = {
                    "protocol": "forgezero-drain/v1",
                    "nonce": nonce,
                    "sourceRevision": REVISION_A,
                    "targetRevision": REVISION_B,
                    "timeoutMs": 1000,
                    "status": "failed",
                    "inFlight": {"http": 0, "websocket": 0, "jobs": 0, "schedules": 0},
                    "failure": "RUNTIME_DRAIN_TIMEOUT" + ESCAPES,
                }
                self._answer(200, body)
            else:
                self._answer(409, {"error": "RUNTIME_DRAIN_ALREADY_STARTED", "detail": ESCAPES})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self._answer(409, {"error": "RUNTIME_DRAIN_ALREADY_STARTED", "detail": "x" + ESCAPES})

        def _answer(self, status: int, body: object) -> None:
            data = orjson.dumps(body)
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.mark.usefixtures("tokens")
def test_control_chars_dropped(capsys: pytest.CaptureFixture[str], hostile_server: str) -> None:
    """Server text reaches the terminal without control characters: escape sequences and bidi
    overrides in detail and failure are dropped before printing."""
    refused = run(capsys, "drain", "--url", hostile_server, *REVISIONS)
    failed = run(capsys, "status", "--url", hostile_server, "--nonce=" + new_nonce())
    assert refused.code == failed.code == 1
    assert "RUNTIME_DRAIN_ALREADY_STARTED" in refused.err
    assert "failure=RUNTIME_DRAIN_TIMEOUT" in failed.out
    for text in (refused.err, failed.out):
        assert not any(c in text for c in "\x1b\x07\u202e\x9b")


@pytest.fixture
def tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGEZERO_CONTROL_TOKEN", CONTROL_TOKEN)


@pytest.mark.parametrize("timeout", ["50ms", "11m", "1h"])
def test_timeout_out_of_bounds(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, timeout: str
) -> None:
    """A drain timeout outside the protocol's bounds is a usage error: --timeout is checked against
    the wire's timeoutMs bounds before anything is sent."""
    monkeypatch.setenv("FORGEZERO_CONTROL_TOKEN", CONTROL_TOKEN)
    revisions = ("--source-revision", REVISION_A, "--target-revision", REVISION_B)
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens: a request would be exit 3
    result = run(capsys, "drain", "--url", url, *revisions, "--timeout", timeout)
    assert result.code == 2
    assert "--timeout" in result.err
    assert "too short: a deadline is at least 100ms" in result.err or (
        "too long: a deadline is at most 10m" in result.err
    )


def test_ready_wait_gives_up_saying_why(
    capsys: pytest.CaptureFixture[str], closed_url: str
) -> None:
    """`ready --wait` against a port nobody listens on gives up after the wait, exit 4, naming
    the refused connection (a start-up script's wait cannot spin forever)."""
    result = run(capsys, "ready", "--url", closed_url, "--wait", "300ms")
    assert result.code == 4, result
    assert "not ready after 0.3s" in result.err
    assert "RUNTIME_UNREACHABLE" in result.err
