"""The shipped OpenAPI document: rebuilt from the wire models, matching codes, routes, serving."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from forgezero_lifecycle._errors import _BY_CODE, MethodNotAllowedError, error_for_code
from forgezero_lifecycle.asgi.control import status_for
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.wire import paths
from forgezero_lifecycle.wire.openapi import build_document, document_bytes, dumps

TOKEN = "openapi-test-token-0123456789"
OPENAPI = paths.RUNTIME_OPENAPI_PATH


def _error_codes(response: dict[str, Any]) -> list[str]:
    schema = response["content"]["application/json"]["schema"]
    codes: list[str] = schema["allOf"][1]["properties"]["error"]["enum"]
    return codes


def test_shipped_document_current() -> None:
    """The shipped document is the one the wire models build: regenerate it with
    `python -m forgezero_lifecycle.wire.openapi` when a model changes."""
    assert document_bytes() == dumps(build_document())


def test_error_codes_and_statuses() -> None:
    """Each documented code exists and is answered with the status it is listed under."""
    document = build_document()
    seen = 0
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                if int(status) < 400 or int(status) == 503:
                    continue
                for code in _error_codes(response):
                    if code == "RUNTIME_METHOD_NOT_ALLOWED":  # built from the allowed methods
                        assert status_for(MethodNotAllowedError("GET")) == int(status)
                        continue
                    assert code in _BY_CODE, (path, method, code)
                    assert status_for(error_for_code(code)) == int(status), (path, code)
                    seen += 1
    assert seen > 30


def test_every_route_documented() -> None:
    """The document's paths are exactly the control plane's routes plus the opt-in document,
    each with its method and its token."""
    runtime = Runtime(control_token=TOKEN)
    routes = runtime.control._routes
    document = build_document()
    assert set(document["paths"]) == {*routes, OPENAPI, paths.RUNTIME_METRICS_PATH}
    for path, route in routes.items():
        (method,) = document["paths"][path]
        assert method == route.method.lower()
        operation = document["paths"][path][method]
        expected = [] if route.token is None else [{route.token: []}]
        assert operation["security"] == expected, path


def test_patterns_are_anchored() -> None:
    """JSON Schema patterns search; the wire's match the whole string, so both ends are anchored."""
    patterns = [
        value
        for value in _walk(build_document())
        if isinstance(value, dict) and isinstance(value.get("pattern"), str)
    ]
    assert patterns
    for schema in patterns:
        assert schema["pattern"].startswith("^(?:")
        assert schema["pattern"].endswith(")$")


def _walk(value: Any) -> Any:
    yield value
    children = (
        value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    )
    for child in children:
        yield from _walk(child)


@pytest.mark.anyio
@pytest.mark.parametrize("enabled", [True, False])
async def test_served_only_when_enabled(enabled: bool) -> None:
    """The document is served only when enabled: Runtime(openapi=True) serves it without a
    token; otherwise the path is not found."""
    app = Starlette()
    Runtime(control_token=TOKEN, openapi=enabled).install(app)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        response = await http.get(OPENAPI)
        posted = await http.post(OPENAPI, content=b"{}")
    if enabled:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        assert json.loads(response.content) == build_document()
        assert (posted.status_code, posted.headers["allow"]) == (405, "GET, HEAD")
        assert posted.json()["error"] == "RUNTIME_METHOD_NOT_ALLOWED"
    else:
        assert (response.status_code, response.json()["error"]) == (404, "RUNTIME_NOT_FOUND")


def test_fuzzer_codes_documented() -> None:
    """Every code the in-process control fuzzer accepts for a path is in the document there."""
    from tests.security.test_control_fuzz import ROUTES

    document = build_document()
    for path, (method, _, statuses) in ROUTES.items():
        responses = document["paths"][path][method.lower()]["responses"]
        for status, codes in statuses.items():
            assert codes <= set(_error_codes(responses[str(status)])), (path, status)
