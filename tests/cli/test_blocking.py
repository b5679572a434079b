"""A drain blocked by a slow request under a real server: `status` names its route template."""

from __future__ import annotations

import json

import pytest

from forgezero_lifecycle.client import new_nonce

from ._run import run
from .conftest import CONTROL_TOKEN, REVISION_A, REVISION_B, StartServe

pytestmark = pytest.mark.server


def test_status_names_slow_request_route(
    start_serve: StartServe, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under uvicorn (serve), a drain's status names the slow request by method, route
    template and age; its query never appears."""
    monkeypatch.setenv("FORGEZERO_CONTROL_TOKEN", CONTROL_TOKEN)
    served = start_serve()
    served.in_background("/held?customer=c-918273")  # in flight until released below
    served.wait_admitted()
    nonce = new_nonce()
    revisions = ("--source-revision", REVISION_A, "--target-revision", REVISION_B)
    begun = run(capsys, "drain", "--url", served.url, *revisions, f"--nonce={nonce}", "--no-wait")
    assert begun.code == 0, begun
    shown = run(capsys, "status", "--url", served.url, f"--nonce={nonce}")
    assert shown.code == 4  # still draining
    assert "oldest: GET /held " in shown.out
    as_json = run(capsys, "status", "--url", served.url, f"--nonce={nonce}", "--json")
    [item] = json.loads(as_json.out)["detail"]["oldestInFlight"]
    assert (item["kind"], item["method"], item["route"]) == ("http", "GET", "/held")
    assert isinstance(item["ageMs"], int)  # to the second: the Date uvicorn gave the request
    assert "c-918273" not in shown.out + as_json.out
    assert run(capsys, "rollback", "--url", served.url, f"--nonce={nonce}").code == 0
    served.get("/_test/release")
    served.join()
