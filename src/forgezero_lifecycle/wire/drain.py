"""Messages of the drain protocol (``forgezero-drain/v1``), as ``lifecycle.d.ts`` types them.

The types are those of the JavaScript `@forgezero/runtime` lifecycle module."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, Field, ValidationError, WithJsonSchema

from .._errors import DrainCountersInvalidError, DrainNotFoundError, DrainRequestInvalidError
from ._protocol import DRAIN_PROTOCOL, MAX_DRAIN_TIMEOUT_MS, MIN_DRAIN_TIMEOUT_MS, DrainState
from ._types import WIRE_CONFIG, Nonce, Revision, SafeInt, first_problem, safe_int

__all__ = [
    "DRAIN_PROTOCOL",
    "MAX_DRAIN_TIMEOUT_MS",
    "MIN_DRAIN_TIMEOUT_MS",
    "DrainRequest",
    "DrainState",
    "DrainStatus",
    "RollbackRequest",
    "WorkCounters",
    "parse_drain_request",
    "parse_rollback_request",
    "validate_counters",
]


class DrainRequest(BaseModel):
    """``POST /.forgezero/runtime/drain/v1/begin``."""

    model_config = WIRE_CONFIG

    protocol: Literal["forgezero-drain/v1"]
    nonce: Nonce
    source_revision: Revision
    target_revision: Revision
    timeout_ms: Annotated[SafeInt, Field(ge=MIN_DRAIN_TIMEOUT_MS, le=MAX_DRAIN_TIMEOUT_MS)]

    def same_drain(self, other: DrainRequest) -> bool:
        """An exact retry: nonce and both revisions (``timeoutMs`` is not compared, as in JS)."""
        return (
            self.nonce == other.nonce
            and self.source_revision == other.source_revision
            and self.target_revision == other.target_revision
        )


class WorkCounters(BaseModel):
    """Admitted, unfinished work per kind. Every counter is 0 before a drain reports drained."""

    model_config = WIRE_CONFIG

    http: int = 0
    websocket: int = 0
    jobs: int = 0
    schedules: int = 0

    @property
    def idle(self) -> bool:
        return self.http == 0 and self.websocket == 0 and self.jobs == 0 and self.schedules == 0


#: ``detail.oldestInFlight``: what a drain still waits for, oldest first (at most five). A route
#: is the template the app's router matched (``/items/{item_id}``), never the raw path; null
#: when no route matched (the method alone names the request then).
OLDEST_IN_FLIGHT_SCHEMA: Final[dict[str, Any]] = {
    "type": "array",
    "maxItems": 5,
    "description": "The oldest requests and WebSocket sessions still running, oldest first.",
    "items": {
        "type": "object",
        "required": ["kind", "method", "route", "ageMs"],
        "properties": {
            "kind": {"type": "string", "enum": ["http", "websocket"]},
            "method": {"type": ["string", "null"]},
            "route": {
                "type": ["string", "null"],
                "description": "The matched route's template, never the raw path.",
            },
            "worker": {
                "type": "integer",
                "description": "Under serve --workers: the index of the worker running it.",
            },
            "ageMs": {
                "type": ["integer", "null"],
                "minimum": 0,
                "description": "Milliseconds since admitted; null when the server keeps no "
                "trace of it.",
            },
        },
    },
}
_DETAIL_SCHEMA: Final[dict[str, Any]] = {
    "anyOf": [
        {
            "type": "object",
            "additionalProperties": True,
            "properties": {"oldestInFlight": OLDEST_IN_FLIGHT_SCHEMA},
        },
        {"type": "null"},
    ],
    "description": "Optional, non-secret: what the runtime knows beyond the counters.",
}


class DrainStatus(DrainRequest):
    """``GET /.forgezero/runtime/drain/v1/status``: the request's own fields plus progress."""

    status: DrainState
    in_flight: WorkCounters
    failure: str | None = None
    #: Optional, non-secret: what the runtime knows beyond the counters (e.g. that it is one of
    #: several worker processes sharing a listening socket).
    detail: Annotated[dict[str, Any] | None, WithJsonSchema(_DETAIL_SCHEMA)] = None


class RollbackRequest(BaseModel):
    """``POST /.forgezero/runtime/drain/v1/rollback``."""

    model_config = WIRE_CONFIG

    nonce: Nonce


def parse_drain_request(data: object) -> DrainRequest:
    """Validate a decoded JSON value; anything but a valid request object is invalid."""
    if isinstance(data, DrainRequest):
        return data
    if not isinstance(data, Mapping):
        raise DrainRequestInvalidError(detail="the drain request must be a JSON object")
    try:
        return DrainRequest.model_validate(data, by_alias=True, by_name=False)
    except ValidationError as error:
        raise DrainRequestInvalidError(detail=first_problem(error)) from None


def parse_rollback_request(data: object) -> RollbackRequest:
    """Validate a decoded JSON value; one that names no drain by a well-formed nonce is not found.

    Not found (404), as ``status`` answers the same nonce, rather than invalid: a rollback is
    addressed to a drain, and one it cannot name is one that does not exist.
    """
    nonce = data.get("nonce") if isinstance(data, Mapping) else None
    if nonce is None:
        raise DrainNotFoundError(detail='the body must name the drain: {"nonce": "..."}')
    try:
        return RollbackRequest.model_validate({"nonce": nonce})
    except ValidationError:
        raise DrainNotFoundError(detail="the nonce must be 43 base64url characters") from None


_COUNTER_KINDS: Final = ("http", "websocket", "jobs", "schedules")


def validate_counters(value: Any) -> WorkCounters:
    """Check a dependency's counters: each kind present as a safe integer ≥ 0; extras dropped."""
    if isinstance(value, WorkCounters):
        return value
    if not isinstance(value, Mapping):
        raise DrainCountersInvalidError(detail="work counters must be a mapping")
    counts: dict[str, int] = {}
    for kind in _COUNTER_KINDS:
        try:
            count = safe_int(value[kind])
        except (KeyError, ValueError):
            raise DrainCountersInvalidError(
                detail=f"counter {kind!r} is not an integer ≥ 0"
            ) from None
        if count < 0:
            raise DrainCountersInvalidError(detail=f"counter {kind!r} is not an integer ≥ 0")
        counts[kind] = count
    return WorkCounters(**counts)
