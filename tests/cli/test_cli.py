"""The CLI against a real served app: every command, every exit code, JSON, no token shown."""

from __future__ import annotations

import json

import pytest

from forgezero_lifecycle.client import new_nonce

from ._run import run
from .conftest import CONTROL_TOKEN, HANDOFF_TOKEN, REVISION_A, REVISION_B, StartServe, free_port

pytestmark = pytest.mark.server

REVISIONS = ("--source-revision", REVISION_A, "--target-revision", REVISION_B)


@pytest.fixture(autouse=True)
def tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGEZERO_CONTROL_TOKEN", CONTROL_TOKEN)
    monkeypatch.setenv("FORGEZERO_HANDOFF_TOKEN", HANDOFF_TOKEN)


def test_drain_waits_prints_json(
    start_serve: StartServe, capsys: pytest.CaptureFixture[str]
) -> None:
    """`drain --json` waits for the in-flight request, exits 0 and prints the final status."""
    served = start_serve()
    slow = served.in_background("/slow?seconds=0.5")
    served.wait_admitted()
    result = run(capsys, "drain", "--url", served.url, *REVISIONS, "--timeout", "10s", "--json")
    assert result.code == 0, result
    status = json.loads(result.out)
    assert status["status"] == "drained"
    assert status["inFlight"] == {"http": 0, "websocket": 0, "jobs": 0, "schedules": 0}
    assert status["sourceRevision"] == REVISION_A
    assert "draining" in result.err  # progress, one line per change (not a TTY)
    served.join()
    assert slow[0].status_code == 200
    followed = run(capsys, "status", "--url", served.url, "--nonce=" + status["nonce"], "--json")
    assert followed.code == 0
    assert json.loads(followed.out)["status"] == "drained"


def test_no_wait_status_rollback(
    start_serve: StartServe, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--no-wait` returns at once; `status` says draining (4); `rollback` serves again (0)."""
    served = start_serve()
    served.in_background("/held")  # in flight until released below, however slow each call is
    served.wait_admitted()
    nonce = new_nonce()
    begun = run(capsys, "drain", "--url", served.url, *REVISIONS, "--nonce=" + nonce, "--no-wait")
    assert begun.code == 0, begun
    assert f"nonce={nonce}" in begun.out
    still = run(capsys, "status", "--url", served.url, "--nonce=" + nonce)
    assert still.code == 4
    assert still.out.startswith("draining")
    found = run(capsys, "status", "--url", served.url, "--json")  # no nonce: the running drain
    assert found.code == 4
    assert json.loads(found.out)["nonce"] == nonce
    assert run(capsys, "ready", "--url", served.url).code == 1
    back = run(capsys, "rollback", "--url", served.url, "--nonce=" + nonce, "--json")
    assert back.code == 0, back
    assert json.loads(back.out)["status"] == "rolled-back"
    assert run(capsys, "ready", "--url", served.url).code == 0
    serving = run(capsys, "status", "--url", served.url)
    assert serving.code == 1
    assert "no drain is running" in serving.err
    served.get("/_test/release")
    served.join()


def test_failed_drain_exits_1(start_serve: StartServe, capsys: pytest.CaptureFixture[str]) -> None:
    """A drain that misses its deadline ends failed: exit 1, the original's code printed."""
    served = start_serve()
    served.in_background("/slow?seconds=2")
    served.wait_admitted()
    result = run(capsys, "drain", "--url", served.url, *REVISIONS, "--timeout", "200ms")
    assert result.code == 1, result
    assert "failure=RUNTIME_DRAIN_TIMEOUT" in result.out
    served.join()


def test_gave_up_waiting_exits_4(
    start_serve: StartServe, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--wait-timeout` shorter than the work: exit 4, and the drain goes on to drained."""
    served = start_serve()
    # The request outlives the 0.2 s wait by 2.8 s: on a loaded machine the CLI's own start
    # took over a second, and a request that ended first let the drain finish in time.
    served.in_background("/slow?seconds=3")
    served.wait_admitted()
    nonce = new_nonce()
    result = run(
        capsys,
        "drain",
        "--url",
        served.url,
        *REVISIONS,
        "--nonce=" + nonce,
        "--wait-timeout",
        "0.2s",
    )
    assert result.code == 4, result
    assert "gave up waiting" in result.err
    served.join()
    assert run(capsys, "status", "--url", served.url, "--nonce=" + nonce).code == 0


def test_server_refusals_exit_1(
    start_serve: StartServe, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unknown nonce, a second drain, a revision mismatch: one line with the code, exit 1."""
    served = start_serve()
    unknown = run(capsys, "status", "--url", served.url, "--nonce=" + new_nonce())
    assert (unknown.code, unknown.err.count("\n")) == (1, 1)
    assert "RUNTIME_DRAIN_NOT_FOUND" in unknown.err
    wrong = ("--source-revision", REVISION_B, "--target-revision", REVISION_A)
    mismatch = run(capsys, "drain", "--url", served.url, *wrong)
    assert mismatch.code == 1
    assert "RUNTIME_DRAIN_REVISION_MISMATCH" in mismatch.err
    assert run(capsys, "drain", "--url", served.url, *REVISIONS).code == 0
    second = run(capsys, "drain", "--url", served.url, *REVISIONS)
    assert second.code == 1
    assert "RUNTIME_DRAIN_ALREADY_STARTED" in second.err


def test_401_and_unreachable_exit_3(
    start_serve: StartServe, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong token and a closed port both exit 3 with one line; the token is never shown."""
    served = start_serve()
    monkeypatch.setenv("FORGEZERO_CONTROL_TOKEN", "a-wrong-token-that-is-long-enough")
    denied = run(capsys, "status", "--url", served.url, "--nonce=" + new_nonce())
    assert denied.code == 3
    assert "RUNTIME_UNAUTHORIZED" in denied.err
    assert "a-wrong-token" not in denied.err
    closed = f"http://127.0.0.1:{free_port()}"
    unreachable = run(capsys, "drain", "--url", closed, *REVISIONS, "--retries", "1")
    assert unreachable.code == 3
    assert "RUNTIME_UNREACHABLE" in unreachable.err
    assert run(capsys, "ready", "--url", closed, "--retries", "0").code == 3


def test_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    """Bad values, a missing token or an unreadable token file: exit 2 before any request."""
    url = f"http://127.0.0.1:{free_port()}"
    bad_revision = run(
        capsys, "drain", "--url", url, "--source-revision", "abc", "--target-revision", REVISION_B
    )
    assert bad_revision.code == 2
    assert "not a revision" in bad_revision.err
    assert run(capsys, "drain", "--url", url, *REVISIONS, "--timeout", "soon").code == 2
    assert run(capsys, "drain", "--url", url, *REVISIONS, "--timeout", "20m").code == 2
    assert run(capsys, "status", "--url", url, "--nonce=" + "short").code == 2
    assert run(capsys, "status", "--url", "ftp://host", "--nonce=" + new_nonce()).code == 2
    monkeypatch.delenv("FORGEZERO_CONTROL_TOKEN")
    missing = run(capsys, "status", "--url", url, "--nonce=" + new_nonce())
    assert missing.code == 2
    assert "FORGEZERO_CONTROL_TOKEN" in missing.err
    absent = run(
        capsys,
        "status",
        "--url",
        url,
        "--nonce=" + new_nonce(),
        "--token-file",
        "/nonexistent/token",
    )
    assert absent.code == 2
    assert run(capsys).code == 2  # no command


def test_token_file_is_read(
    start_serve: StartServe,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: object,
) -> None:
    """`--token-file` replaces the environment variable."""
    from pathlib import Path

    served = start_serve()
    token_file = Path(str(tmp_path)) / "token"
    token_file.write_text(CONTROL_TOKEN + "\n")
    monkeypatch.delenv("FORGEZERO_CONTROL_TOKEN")
    result = run(capsys, "drain", "--url", served.url, *REVISIONS, "--token-file", str(token_file))
    assert result.code == 0, result


def test_handoff_moves_state(start_serve: StartServe, capsys: pytest.CaptureFixture[str]) -> None:
    """handoff moves the state to the new generation: drain A, then
    `handoff --to B --from-export-url A`: acknowledged, digest shown, exit 0."""
    old = start_serve()
    new = start_serve(revision=REVISION_B)
    for _ in range(3):
        assert old.get("/fast").status_code == 200
    assert run(capsys, "drain", "--url", old.url, *REVISIONS).code == 0
    args = ("--protocol", "tests.cli.counter", "--schema-version", "1", *REVISIONS)
    result = run(capsys, "handoff", "--to", new.url, "--from-export-url", old.url, *args, "--json")
    assert result.code == 0, result
    status = json.loads(result.out)
    assert status["status"] == "acknowledged"
    assert status["cursor"] == "count-3"
    assert status["digest"].startswith("sha256:")
    assert new.counters()["imported"] == 3


def test_failed_handoff_exits_1(
    start_serve: StartServe, capsys: pytest.CaptureFixture[str]
) -> None:
    """A source that is not draining answers 409: the handoff fails with that HTTP code."""
    old = start_serve()
    new = start_serve(revision=REVISION_B)
    args = ("--protocol", "tests.cli.counter", "--schema-version", "1", *REVISIONS)
    result = run(capsys, "handoff", "--to", new.url, "--from-export-url", old.url, *args)
    assert result.code == 1, result
    assert "failure=RUNTIME_STATE_SOURCE_HTTP_409" in result.out
    wrong = run(capsys, "handoff", "--to", new.url, "--from-export-url", old.url,
                "--protocol", "other.protocol", "--schema-version", "1", *REVISIONS)  # fmt: skip
    assert wrong.code == 2  # RUNTIME_STATE_REQUEST_INVALID: the request itself is wrong
