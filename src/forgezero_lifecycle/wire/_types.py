"""Field types shared by every wire model: the original's validation, made strict.

The original is the JavaScript `@forgezero/runtime` lifecycle module.

The JavaScript module validates with JavaScript ``RegExp.test`` and ``Number.isSafeInteger``. The
port keeps the same patterns and ranges but refuses values of the wrong JSON type (strict types): a
nonce wrapped in an array, ``true`` for a number, ``"100"`` for a number. Integral floats
(``100.0``, ``1e2``) are integers, as in JavaScript. Patterns match the whole string
(``re.fullmatch``), since Python's ``$`` also matches before a final newline.

The plain checks the types are built on (:func:`safe_int`, :func:`is_nonce`, :func:`is_revision`,
the patterns) are :mod:`~forgezero_lifecycle.wire._protocol`'s, re-exported here; code that must
not import pydantic imports them from there.

Port rules D1-D9 are listed in ``tests/conformance/vectors.json``, ``meta.format_notes.port_rules``.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    StrictStr,
    ValidationError,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel

from ._protocol import (
    MAX_SAFE_INTEGER,
    NONCE_PATTERN,
    REVISION_PATTERN,
    is_nonce,
    is_revision,
    safe_int,
)

__all__ = [
    "MAX_SAFE_INTEGER",
    "NONCE_PATTERN",
    "REVISION_PATTERN",
    "WIRE_CONFIG",
    "Nonce",
    "Revision",
    "SafeInt",
    "first_problem",
    "is_nonce",
    "is_revision",
    "matching",
    "pattern_schema",
    "safe_int",
]

#: Every wire model: camelCase on the wire, snake_case in Python, immutable, unknown fields
#: ignored and never echoed (a retry that differs only in them is still a duplicate).
WIRE_CONFIG = ConfigDict(
    alias_generator=to_camel,
    validate_by_name=True,
    validate_by_alias=True,
    serialize_by_alias=True,
    frozen=True,
    extra="ignore",
)


def matching(pattern: re.Pattern[str]) -> AfterValidator:
    """A validator that requires the whole string to match ``pattern``."""

    def check(value: str) -> str:
        if pattern.fullmatch(value) is None:
            raise ValueError(f"does not match {pattern.pattern}")
        return value

    return AfterValidator(check)


def pattern_schema(pattern: re.Pattern[str]) -> WithJsonSchema:
    """The JSON Schema of a string that must match ``pattern`` whole (for the OpenAPI document).

    JSON Schema patterns search (ECMA-262), so the pattern is anchored at both ends.
    """
    return WithJsonSchema({"type": "string", "pattern": f"^(?:{pattern.pattern})$"})


SafeInt = Annotated[int, BeforeValidator(safe_int)]
Nonce = Annotated[StrictStr, matching(NONCE_PATTERN), pattern_schema(NONCE_PATTERN)]
Revision = Annotated[StrictStr, matching(REVISION_PATTERN), pattern_schema(REVISION_PATTERN)]


def first_problem(error: ValidationError) -> str:
    """``where: what`` of a validation error's first problem, never the input it was given."""
    problem = error.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in problem["loc"]) or "body"
    return f"{where}: {problem['msg']}"
