"""Wire shapes and constants of the typed state handoff (the ``RuntimeState*`` types).

The types are those of the JavaScript `@forgezero/runtime` lifecycle module.

A handoff moves one typed, versioned, digest-checked value from the draining generation to the
new one. The new generation receives a :class:`StateHandoffRequest` (where to fetch from and with
which bearer token), fetches a :class:`StateEnvelope` from the old generation's export endpoint,
and reports progress as a :class:`StateHandoffStatus`. The adapter's ``import_state`` receives a
:class:`StateImportContext` beside the value.

Every model uses :data:`~forgezero_lifecycle.wire._types.WIRE_CONFIG`: camelCase on the wire,
unknown fields ignored and never echoed. Serialize with ``model_dump(mode="json",
exclude_none=True)``. Patterns are the JavaScript module's, matched against the whole string with
:meth:`re.Pattern.fullmatch`.

Port rules D1-D9 are listed in ``tests/conformance/vectors.json``, ``meta.format_notes.port_rules``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from ._types import WIRE_CONFIG, Nonce, Revision, SafeInt, matching, pattern_schema

__all__ = [
    "AUTHORIZATION_PATTERN",
    "CURSOR_PATTERN",
    "DIGEST_PATTERN",
    "HANDOFF_TEXT_PATTERN",
    "MAX_SCHEMA_VERSION",
    "MAX_STATE_BYTES",
    "SOURCE_SLACK_BYTES",
    "Authorization",
    "Cursor",
    "Digest",
    "HandoffText",
    "SchemaVersion",
    "StateEnvelope",
    "StateHandoffRequest",
    "StateHandoffStatus",
    "StateImportContext",
    "StateSource",
    "StateStatusName",
]

#: Adapter and request ``protocol``: a short name such as ``demo.counter``.
HANDOFF_TEXT_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@/-]{0,127}")
#: The exporter's position in its own history, echoed to the orchestrator on acknowledgement.
CURSOR_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@/+\-=]{0,511}")
#: ``sha256:`` and 64 lower-case hex digits of the canonical JSON of the unsigned envelope.
DIGEST_PATTERN: Final = re.compile(r"sha256:[a-f0-9]{64}")
#: The only accepted form of ``source.authorization``: a bearer token of 43 base64url characters.
AUTHORIZATION_PATTERN: Final = re.compile(r"Bearer [A-Za-z0-9_-]{43}")

#: Hard ceiling of an adapter's ``maximum_bytes`` (1 MiB).
MAX_STATE_BYTES: Final = 1_048_576
#: The size bound is the canonical form's: the raw (decoded) HTTP body may exceed ``maximum_bytes``
#: by this much (whitespace, key order, escapes written differently), since the limit applies to the
#: canonical form.
SOURCE_SLACK_BYTES: Final = 4096
MAX_SCHEMA_VERSION: Final = 65_535

HandoffText = Annotated[
    StrictStr, matching(HANDOFF_TEXT_PATTERN), pattern_schema(HANDOFF_TEXT_PATTERN)
]
Cursor = Annotated[StrictStr, matching(CURSOR_PATTERN), pattern_schema(CURSOR_PATTERN)]
Digest = Annotated[StrictStr, matching(DIGEST_PATTERN), pattern_schema(DIGEST_PATTERN)]
Authorization = Annotated[
    StrictStr, matching(AUTHORIZATION_PATTERN), pattern_schema(AUTHORIZATION_PATTERN)
]
SchemaVersion = Annotated[SafeInt, Field(ge=1, le=MAX_SCHEMA_VERSION)]
StateStatusName = Literal["pending", "acknowledged", "failed"]


#: Models that carry the handoff token: a validation error never shows the input it refused.
_SECRET_CONFIG: Final = ConfigDict(**WIRE_CONFIG, hide_input_in_errors=True)


class StateSource(BaseModel):
    """Where the new generation fetches the envelope: a loopback ``http`` URL and its token."""

    model_config = _SECRET_CONFIG

    url: StrictStr
    #: ``Bearer <token>``; kept out of ``repr`` so a logged request never shows the token.
    authorization: Authorization = Field(repr=False)


class StateHandoffRequest(BaseModel):
    """Body of ``POST /.forgezero/runtime/state/v1/begin`` (``timeoutMs`` travels beside it)."""

    model_config = _SECRET_CONFIG

    protocol: HandoffText
    nonce: Nonce
    schema_version: SchemaVersion
    source_revision: Revision
    target_revision: Revision
    source: StateSource


class StateEnvelope(BaseModel):
    """What the export endpoint serves; ``digest`` covers every other field."""

    model_config = WIRE_CONFIG

    protocol: HandoffText
    schema_version: SchemaVersion
    source_revision: Revision
    target_revision: Revision
    cursor: Cursor
    #: The adapter's value as JSON-compatible data (``model_dump(mode="json")``).
    value: Any
    digest: Digest


class StateImportContext(BaseModel):
    """Passed to ``StateAdapter.import_state`` beside the validated value."""

    model_config = WIRE_CONFIG

    source_revision: Revision
    target_revision: Revision
    cursor: Cursor
    digest: Digest


class StateHandoffStatus(BaseModel):
    """Body of ``GET /.forgezero/runtime/state/v1/status``: acknowledgement metadata only.

    ``cursor`` and ``digest`` are present once acknowledged, ``failure`` once failed; dump with
    ``exclude_none=True`` so absent fields are omitted as in the JavaScript module.
    """

    model_config = WIRE_CONFIG

    protocol: StrictStr
    nonce: Nonce
    schema_version: SafeInt
    source_revision: Revision
    target_revision: Revision
    status: StateStatusName
    cursor: StrictStr | None = None
    digest: StrictStr | None = None
    failure: StrictStr | None = None
