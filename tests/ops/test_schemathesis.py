"""schemathesis against a real ``forgezero-lifecycle serve``d app, from its own OpenAPI document.

Positive and negative cases for every operation, sent with the right token, to a generation that
is serving and to one that has drained: no 5xx, every status, header, content type and body
matches the document, data the document forbids is refused with a 4xx, and no request changes
state (no drain, rollback or handoff begins; readiness stays what it was). ``FORGEZERO_SOAK=1``
runs many more examples.
"""

from __future__ import annotations

from typing import Any, Final

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from forgezero_lifecycle.client import SyncControlClient, drain_request
from forgezero_lifecycle.core._httpx import tls_context
from forgezero_lifecycle.wire import paths
from tests.cli.conftest import (
    BOUND,
    CONTROL_TOKEN,
    HANDOFF_TOKEN,
    REVISION_A,
    REVISION_B,
    StartServe,
)
from tests.reliability._soak import report, scale

pytestmark = pytest.mark.server

EXAMPLES: Final = scale(120, 3000)
CHECKS: Final = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.mark.timeout(scale(120, 3600))
@pytest.mark.parametrize("state", ["serving", "drained"])
def test_no_5xx_drift_or_change(start_serve: StartServe, state: str) -> None:
    """Every generated request is answered as documented and leaves the generation as it was."""
    served = start_serve("tests.ops.app:app")
    if state == "drained":
        request = drain_request(
            source_revision=REVISION_A, target_revision=REVISION_B, timeout_ms=5000
        )
        with SyncControlClient(served.url, token=CONTROL_TOKEN) as control:
            control.begin_drain(request)
            assert control.wait_drained(request.nonce, timeout=30).status == "drained"
    unchanged = served.get("/_test/state").json()
    assert unchanged["drain_active"] is (state == "drained")
    readiness = served.get(paths.RUNTIME_READY_PATH).status_code
    document = served.get(paths.RUNTIME_OPENAPI_PATH).json()
    schema = schemathesis.openapi.from_dict(document)
    strategy = st.one_of(
        schema.as_strategy(schemathesis.GenerationMode.POSITIVE),
        schema.as_strategy(schemathesis.GenerationMode.NEGATIVE),
    )
    seen: dict[str, int] = {}
    # One client for the checks after each example (a client per call builds a TLS context
    # each time: most of the test's CPU, enough to miss its timeout on a loaded machine).
    probe = httpx.Client(base_url=served.url, timeout=BOUND, trust_env=False, verify=tls_context())

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def fuzz(case: Any) -> None:
        token = HANDOFF_TOKEN if case.path == paths.RUNTIME_STATE_EXPORT_PATH else CONTROL_TOKEN
        headers = {"Authorization": f"Bearer {token}"}
        # Readiness answers a documented 503 while draining: the one 5xx the document allows.
        checks = CHECKS[1:] if case.path == paths.RUNTIME_READY_PATH else CHECKS
        response = case.call_and_validate(
            base_url=served.url, headers=headers, checks=checks, timeout=10
        )
        assert response.status_code < 500 or case.path == paths.RUNTIME_READY_PATH
        key = f"{case.method} {case.path} {response.status_code}"
        seen[key] = seen.get(key, 0) + 1
        assert probe.get("/_test/state").json() == unchanged, key
        assert probe.get(paths.RUNTIME_READY_PATH).status_code == readiness

    with probe:
        fuzz()
    assert "Traceback" not in served.log()
    operations = {key.rsplit(" ", 1)[0] for key in seen}
    assert len(operations) >= 10, sorted(seen)
    report(f"schemathesis-{state}", examples=sum(seen.values()), answers=dict(sorted(seen.items())))
