"""The control plane as an OpenAPI 3.1 document, built from the wire models.

:func:`build_document` derives every body schema from the pydantic models of this package
(``model_json_schema``), and lists each path's statuses with the error codes it may answer. The
package ships the result as ``openapi.json`` beside this module (read by :func:`document_bytes`,
served by ``Runtime(openapi=True)``); ``tests/wire/test_openapi.py`` rebuilds it and fails when the
shipped file differs, so the document cannot drift from the models. Regenerate it with::

    python -m forgezero_lifecycle.wire.openapi > src/forgezero_lifecycle/wire/openapi.json
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any, Final

import orjson
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from . import paths
from ._types import NONCE_PATTERN, REVISION_PATTERN, pattern_schema
from .accepted import Accepted
from .drain import (
    MAX_DRAIN_TIMEOUT_MS,
    MIN_DRAIN_TIMEOUT_MS,
    DrainRequest,
    DrainStatus,
    RollbackRequest,
)
from .handoff import StateEnvelope, StateHandoffRequest, StateHandoffStatus
from .supervisor import (
    HandoverStatus,
    ReloadAccepted,
    ScaleAccepted,
    ScaleRequest,
    SupervisorStatus,
)

__all__ = ["OPENAPI_VERSION", "build_document", "document_bytes", "dumps"]

OPENAPI_VERSION: Final = "3.1.0"
_REF: Final = "#/components/schemas/{model}"
_MODELS: Final[Sequence[tuple[type[BaseModel], JsonSchemaMode]]] = (
    (DrainRequest, "validation"),
    (RollbackRequest, "validation"),
    (StateHandoffRequest, "validation"),
    (Accepted, "serialization"),
    (DrainStatus, "serialization"),
    (StateEnvelope, "serialization"),
    (StateHandoffStatus, "serialization"),
    (ReloadAccepted, "serialization"),
    (HandoverStatus, "serialization"),
    (ScaleRequest, "validation"),
    (ScaleAccepted, "serialization"),
    (SupervisorStatus, "serialization"),
)
#: JSON Schema names of the constraints pydantic leaves as-is after a ``BeforeValidator``.
_KEYWORDS: Final[Mapping[str, str]] = {
    "ge": "minimum",
    "le": "maximum",
    "gt": "exclusiveMinimum",
    "lt": "exclusiveMaximum",
}

#: Errors every authenticated path may answer, by status.
_AUTH_ERRORS: Final = {401: ("RUNTIME_UNAUTHORIZED",)}
_BODY_ERRORS: Final = {
    408: ("RUNTIME_BODY_TIMEOUT",),
    413: ("RUNTIME_BODY_TOO_LARGE",),
    415: ("RUNTIME_CONTENT_TYPE",),
}
#: The supervisor's paths, answered only under ``serve --workers``: elsewhere a 404 that says so.
_SUPERVISED: Final = "Only under `forgezero-lifecycle serve --workers N`; elsewhere 404."


@functools.cache
def document_bytes() -> bytes:
    """The shipped document, as served (``openapi.json`` of this package)."""
    return resources.files(__package__).joinpath("openapi.json").read_bytes()


def build_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of every control path, from the wire models."""
    _, definitions = models_json_schema(_MODELS, by_alias=True, ref_template=_REF)
    schemas: dict[str, Any] = {
        name: _clean(schema) for name, schema in sorted(definitions["$defs"].items())
    }
    schemas["StateHandoffBegin"] = {
        "description": "The handoff request with the deadline of the fetch beside it.",
        "allOf": [
            {"$ref": _REF.format(model="StateHandoffRequest")},
            {
                "type": "object",
                "properties": {"timeoutMs": _timeout_schema()},
                "required": ["timeoutMs"],
            },
        ],
    }
    schemas["Error"] = {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "string"}, "detail": {"type": "string"}},
    }
    schemas["ReloadRequest"] = {
        "description": "A reload takes no fields: the empty object.",
        "type": "object",
        "maxProperties": 0,
    }
    schemas["Schedules"] = {
        "type": "object",
        "required": ["schedules"],
        "properties": {"schedules": {"type": "array", "items": {"type": "object"}}},
    }
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "forgezero-lifecycle control plane",
            "version": "v1",
            "description": "Drain, roll back and hand state over between generations of an ASGI "
            "service. Wire-compatible with the JavaScript `@forgezero/runtime` lifecycle module; "
            "`drain/v1/current`, `schedules/v1/status` and the `supervisor/v1` paths are "
            "additions of this port.",
        },
        "paths": _paths(),
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "control": {"type": "http", "scheme": "bearer", "description": "control token"},
                "handoff": {"type": "http", "scheme": "bearer", "description": "handoff token"},
            },
        },
    }


def _paths() -> dict[str, Any]:
    nonce = _query("nonce", "the nonce the drain or handoff began with", NONCE_PATTERN)
    revisions = [
        _query("sourceRevision", "40 lower-case hex digits", REVISION_PATTERN),
        _query("targetRevision", "40 lower-case hex digits", REVISION_PATTERN),
    ]
    return {
        paths.RUNTIME_DRAIN_BEGIN_PATH: {
            "post": _operation(
                "beginDrain",
                "Begin draining this generation (an exact retry is a duplicate).",
                body="DrainRequest",
                ok=(202, "Accepted"),
                errors={
                    400: ("RUNTIME_DRAIN_REQUEST_INVALID",),
                    409: (
                        "RUNTIME_DRAIN_ALREADY_STARTED",
                        "RUNTIME_DRAIN_REVISION_MISMATCH",
                        "RUNTIME_DRAIN_SHARED_LISTENER",
                        "RUNTIME_DRAIN_GENERATION_RETIRING",
                    ),
                },
            )
        },
        paths.RUNTIME_DRAIN_STATUS_PATH: {
            "get": _operation(
                "drainStatus",
                "The status of the drain begun with `nonce`.",
                parameters=[nonce],
                ok=(200, "DrainStatus"),
                errors={404: ("RUNTIME_DRAIN_NOT_FOUND",)},
            )
        },
        paths.RUNTIME_DRAIN_CURRENT_PATH: {
            "get": _operation(
                "currentDrain",
                "The running drain's status, nonce included; 404 while serving.",
                ok=(200, "DrainStatus"),
                errors={404: ("RUNTIME_DRAIN_NOT_FOUND",)},
            )
        },
        paths.RUNTIME_DRAIN_ROLLBACK_PATH: {
            "post": _operation(
                "rollbackDrain",
                "Return a draining, drained or failed generation to serving.",
                body="RollbackRequest",
                ok=(200, "DrainStatus"),
                errors={
                    400: ("RUNTIME_DRAIN_REQUEST_INVALID",),
                    404: ("RUNTIME_DRAIN_NOT_FOUND",),
                },
            )
        },
        paths.RUNTIME_STATE_EXPORT_PATH: {
            "get": _operation(
                "exportState",
                "The signed state envelope (handoff token; only once intake is closed).",
                parameters=[*revisions, _import_check()],
                ok=(200, "StateEnvelope"),
                security="handoff",
                errors={
                    400: ("RUNTIME_STATE_REVISION_INVALID",),
                    404: ("RUNTIME_STATE_NOT_FOUND",),
                    409: ("RUNTIME_STATE_NOT_DRAINING", "RUNTIME_STATE_REVISION_MISMATCH"),
                    413: ("RUNTIME_STATE_EXPORT_TOO_LARGE",),
                    422: ("RUNTIME_STATE_EXPORT_INVALID",),
                },
            )
        },
        paths.RUNTIME_STATE_BEGIN_PATH: {
            "post": _operation(
                "beginHandoff",
                "Make this (new) generation fetch and import the old one's state.",
                body="StateHandoffBegin",
                ok=(202, "Accepted"),
                errors={
                    400: (
                        "RUNTIME_STATE_REQUEST_INVALID",
                        "RUNTIME_STATE_SOURCE_INVALID",
                    ),
                    404: ("RUNTIME_STATE_NOT_FOUND",),
                    409: ("RUNTIME_STATE_ALREADY_STARTED",),
                },
            )
        },
        paths.RUNTIME_STATE_STATUS_PATH: {
            "get": _operation(
                "handoffStatus",
                "The status of the handoff begun with `nonce`.",
                parameters=[nonce],
                ok=(200, "StateHandoffStatus"),
                errors={404: ("RUNTIME_STATE_NOT_FOUND",)},
            )
        },
        paths.RUNTIME_SCHEDULES_STATUS_PATH: {
            "get": _operation(
                "schedulesStatus",
                "Per scheduled job: last run, result, error, consecutive failures, next run.",
                ok=(200, "Schedules"),
            )
        },
        paths.RUNTIME_SUPERVISOR_RELOAD_PATH: {
            "post": _operation(
                "reload",
                "Hand over to a new generation on the same socket, as SIGHUP does; answers the "
                f"handover's number. {_SUPERVISED}",
                body="ReloadRequest",
                ok=(202, "ReloadAccepted"),
                errors={
                    400: ("RUNTIME_DRAIN_REQUEST_INVALID",),
                    404: ("RUNTIME_NOT_FOUND",),
                    409: ("RUNTIME_RELOAD_BUSY",),
                    503: ("RUNTIME_SUPERVISOR_UNAVAILABLE",),
                },
            )
        },
        paths.RUNTIME_SUPERVISOR_HANDOVER_PATH: {
            "get": _operation(
                "handoverStatus",
                "How the handover `reload` answered went (without `handover`: the latest): "
                f"running, done or aborted. {_SUPERVISED}",
                parameters=[
                    {
                        "name": "handover",
                        "in": "query",
                        "required": False,
                        "description": "the number reload answered",
                        "schema": {"type": "string", "pattern": "^(?:[0-9]{1,9})$"},
                    }
                ],
                ok=(200, "HandoverStatus"),
                errors={
                    404: ("RUNTIME_NOT_FOUND",),
                    503: ("RUNTIME_SUPERVISOR_UNAVAILABLE",),
                },
            )
        },
        paths.RUNTIME_SUPERVISOR_SCALE_PATH: {
            "post": _operation(
                "scale",
                "Add (`by` 1) or remove (`by` -1) one worker of the generation that serves, as "
                "SIGTTIN and SIGTTOU do; an added worker accepts once ready, a removed one hands "
                f"its keep-alive clients over and drains; never below one. {_SUPERVISED}",
                body="ScaleRequest",
                ok=(202, "ScaleAccepted"),
                errors={
                    400: ("RUNTIME_DRAIN_REQUEST_INVALID",),
                    404: ("RUNTIME_NOT_FOUND",),
                    409: ("RUNTIME_SCALE_REFUSED",),
                    503: ("RUNTIME_SUPERVISOR_UNAVAILABLE",),
                },
            )
        },
        paths.RUNTIME_SUPERVISOR_STATUS_PATH: {
            "get": _operation(
                "supervisorStatus",
                "The supervisor's workers, the replacements made (recycled, unresponsive, "
                f"added) and the unresponsive workers seen. {_SUPERVISED}",
                ok=(200, "SupervisorStatus"),
                errors={
                    404: ("RUNTIME_NOT_FOUND",),
                    503: ("RUNTIME_SUPERVISOR_UNAVAILABLE",),
                },
            )
        },
        paths.RUNTIME_READY_PATH: {
            "get": {
                "operationId": "ready",
                "summary": "Readiness: 200 while serving, 503 (naming the drain's state) from the "
                "instant a drain begins.",
                "security": [],
                "responses": {
                    "200": _json_response("ready", _object(ready={"const": True})),
                    "503": _json_response(
                        "draining",
                        _object(
                            ready={"const": False},
                            status={"enum": ["draining", "drained", "failed"]},
                        ),
                    ),
                },
            }
        },
        paths.RUNTIME_LIVE_PATH: {
            "get": {
                "operationId": "live",
                "summary": "Liveness: 200 while the process works (also while draining).",
                "security": [],
                "responses": {"200": _json_response("live", _object(live={"const": True}))},
            }
        },
        paths.RUNTIME_METRICS_PATH: {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics (served only when enabled; no token needed).",
                "security": [],
                "responses": {
                    "200": {
                        "description": "the text exposition format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        paths.RUNTIME_OPENAPI_PATH: {
            "get": {
                "operationId": "openapi",
                "summary": "This document (served only when enabled; no token needed).",
                "security": [],
                "responses": {"200": _json_response("the document", {"type": "object"})},
            }
        },
    }


def _operation(
    operation_id: str,
    summary: str,
    *,
    ok: tuple[int, str],
    body: str | None = None,
    parameters: Sequence[Mapping[str, Any]] = (),
    security: str = "control",
    errors: Mapping[int, Sequence[str]] | None = None,
) -> dict[str, Any]:
    every = {**_AUTH_ERRORS, **(_BODY_ERRORS if body else {}), **(errors or {})}
    if body:  # an invalid body is RUNTIME_*_REQUEST_INVALID: listed by the caller under 400
        assert 400 in every, operation_id
    responses: dict[str, Any] = {
        str(ok[0]): _json_response("success", {"$ref": _REF.format(model=ok[1])})
    }
    for status, codes in sorted(every.items()):
        responses[str(status)] = _error_response(status, codes)
    responses["405"] = _error_response(405, ("RUNTIME_METHOD_NOT_ALLOWED",))
    operation: dict[str, Any] = {
        "operationId": operation_id,
        "summary": summary,
        "security": [{security: []}],
        "responses": responses,
    }
    if parameters:
        operation["parameters"] = list(parameters)
    if body:
        operation["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": _REF.format(model=body)}},
            },
        }
    return operation


def _error_response(status: int, codes: Sequence[str]) -> dict[str, Any]:
    response = _json_response(
        " / ".join(codes),
        {
            "allOf": [
                {"$ref": _REF.format(model="Error")},
                {"properties": {"error": {"enum": list(codes)}}},
            ]
        },
    )
    if status == 401:
        response["headers"] = {"WWW-Authenticate": _header("Bearer")}
    elif status == 405:
        response["headers"] = {"Allow": _header("the methods this path answers")}
    return response


def _header(description: str) -> dict[str, Any]:
    return {"required": True, "description": description, "schema": {"type": "string"}}


def _json_response(description: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _object(**properties: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": sorted(properties), "properties": dict(properties)}


def _import_check() -> dict[str, Any]:
    return {
        "name": paths.IMPORT_CHECK_QUERY,
        "in": "query",
        "required": False,
        "description": (
            f"`{paths.IMPORTER_CHECKS}` in the URL a new generation fetches: its import validates "
            "the value against its model itself, so the export makes no import check of its own "
            "(no 422 RUNTIME_STATE_EXPORT_INVALID for a value that would not import)"
        ),
        "schema": {"type": "string", "enum": [paths.IMPORTER_CHECKS]},
    }


def _query(name: str, description: str, pattern: re.Pattern[str]) -> dict[str, Any]:
    # Optional on the wire: a missing or malformed value is answered (404 / 400) like any other
    # that names nothing.
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": pattern_schema(pattern).json_schema,
    }


def _timeout_schema() -> dict[str, Any]:
    return {"type": "integer", "minimum": MIN_DRAIN_TIMEOUT_MS, "maximum": MAX_DRAIN_TIMEOUT_MS}


def _clean(schema: Any) -> Any:
    """pydantic's schema made tidy: no titles, JSON Schema names for every range keyword."""
    if isinstance(schema, list):
        return [_clean(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    cleaned: dict[str, Any] = {}
    key: str
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key == "properties":
            cleaned[key] = {name: _clean(item) for name, item in value.items()}
        else:
            cleaned[_KEYWORDS.get(key, key)] = _clean(value)
    return cleaned


def dumps(document: Mapping[str, Any]) -> bytes:
    """The document as the shipped file holds it: indented, keys sorted, newline at the end."""
    return orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"


if __name__ == "__main__":  # pragma: no cover - regenerates the shipped file
    sys.stdout.buffer.write(dumps(build_document()))
