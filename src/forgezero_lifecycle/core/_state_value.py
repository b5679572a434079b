"""The adapter's value model: construction checks, validation, and failure text.

Validation has two strengths, used at the JavaScript `@forgezero/runtime` lifecycle module's two
points:

* :func:`accepts` is the JavaScript module's ``adapter.validate(value)``: the model's own (lax)
  validation of the parsed value. The controller consults it only to order errors as the JavaScript
  module does when the value cannot be canonicalised (a value the model refuses is invalid before it
  is unencodable).
* :func:`load` builds the typed value handed to ``import_state``: the model validates the
  *canonical JSON* of the value in strict JSON mode, so what the exporter checked is exactly what
  the importer receives ("a state that exports must import") and no silent
  coercion (``"7"`` for ``7``) happens on the way in.

Port rules D1-D9 are listed in ``tests/conformance/vectors.json``, ``meta.format_notes.port_rules``.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Annotated, Any, Final, TypeVar, get_args, get_origin, get_type_hints

from pydantic import BaseModel, Secret, SecretBytes, SecretStr, ValidationError

from .._errors import StateInputInvalidError
from ..wire._types import safe_int

__all__ = ["accepts", "adapter_int", "dumped", "failure_text", "load", "refuse_secret_fields"]

M = TypeVar("M", bound=BaseModel)

_SECRET_TYPES: Final = (SecretStr, SecretBytes, Secret)
#: A failure text is cut to this many code points (never inside a surrogate pair).
_FAILURE_CODE_POINTS: Final = 128


def adapter_int(value: object, high: int) -> int:
    """``value`` as a safe integer in [1, high], else ``RUNTIME_STATE_ADAPTER_INVALID``."""
    try:
        number = safe_int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= high:
        raise StateInputInvalidError(
            "RUNTIME_STATE_ADAPTER_INVALID",
            f"expected an integer from 1 to {high}, not {_shown(value)}",
        )
    return number


def _shown(value: object) -> str:
    """A short, always-printable account of a bad setting (a huge int has no cheap repr)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def refuse_secret_fields(model: type[BaseModel]) -> None:
    """Raise ``RUNTIME_STATE_ADAPTER_INVALID`` if any field, however nested, is a secret type.

    Handoff state is non-secret by design: it is served over loopback HTTP, digested and shown
    to nobody, but it is not encrypted, and a secret belongs in a named secret reference.
    """
    where = _secret_path(model, model.__name__, set())
    if where is not None:
        raise StateInputInvalidError(
            "RUNTIME_STATE_ADAPTER_INVALID",
            f"{where} is a secret type; handoff state is non-secret, pass a secret reference",
        )


def _secret_path(tp: object, where: str, seen: set[int]) -> str | None:
    if id(tp) in seen:
        return None
    seen.add(id(tp))
    alias_value = getattr(tp, "__value__", None)
    if type(tp).__name__ == "TypeAliasType" and alias_value is not None:
        return _secret_path(alias_value, where, seen)
    origin = get_origin(tp)
    if origin is Annotated:
        return _secret_path(get_args(tp)[0], where, seen)
    if isinstance(tp, type):
        if issubclass(tp, _SECRET_TYPES):
            return where
        return _members_secret_path(tp, where, seen)
    if isinstance(origin, type) and issubclass(origin, _SECRET_TYPES):
        return where
    for arg in get_args(tp):
        found = _secret_path(arg, where, seen)
        if found is not None:
            return found
    return None


def _members_secret_path(tp: type, where: str, seen: set[int]) -> str | None:
    hints: dict[str, object]
    if issubclass(tp, BaseModel):
        hints = {name: field.annotation for name, field in tp.model_fields.items()}
    elif dataclasses.is_dataclass(tp) or typing.is_typeddict(tp):
        try:
            hints = dict(get_type_hints(tp, include_extras=True))
        except (NameError, TypeError):
            hints = {}
    else:
        return None
    for name, hint in hints.items():
        found = _secret_path(hint, f"{where}.{name}", seen)
        if found is not None:
            return found
    return None


def accepts(model: type[BaseModel], value: object) -> bool:
    """The model's own validation of ``value`` (the JavaScript module's ``adapter.validate``)."""
    try:
        model.model_validate(value)
    except (ValidationError, ValueError, TypeError):
        return False
    return True


def load(model: type[M], encoded: bytes) -> M:
    """The typed value: ``encoded`` (canonical JSON of the value) validated strictly as JSON.

    Raises :class:`ValueError` (a :class:`ValidationError` included) when the model refuses it.
    """
    try:
        return model.model_validate_json(encoded, strict=True)
    except ValidationError as exc:
        if not any(error["type"] == "json_invalid" for error in exc.errors()):
            raise
    # pydantic's JSON reader refuses lone surrogate escapes, which JSON.parse and canonical JSON
    # accept: read the same canonical text with the standard library and validate that, strictly.
    return model.model_validate(json.loads(encoded), strict=True)


def failure_text(text: str) -> str:
    """``text`` cut to 128 code points, never between the two halves of a surrogate pair."""
    out: list[str] = []
    i = 0
    while i < len(text) and len(out) < _FAILURE_CODE_POINTS:
        pair = text[i : i + 2]
        if len(pair) == 2 and "\ud800" <= pair[0] <= "\udbff" and "\udc00" <= pair[1] <= "\udfff":
            out.append(pair)
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def dumped(value: BaseModel) -> Any:
    """The value as JSON-compatible data, by alias (what travels in the envelope)."""
    return value.model_dump(mode="json", by_alias=True)
