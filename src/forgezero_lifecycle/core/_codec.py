"""Sealing and opening state envelopes for one adapter: the handoff's checks, without I/O.

The order of the checks is that of the JavaScript `@forgezero/runtime` lifecycle module, so
the first failing check names the error:

* seal (export): cursor, then the value against its model (``RUNTIME_STATE_EXPORT_INVALID``),
  then canonical JSON (``RUNTIME_STATE_VALUE_INVALID``), then the size
  (``RUNTIME_STATE_EXPORT_TOO_LARGE``);
* open (import): the envelope's fields and the value against its model
  (``RUNTIME_STATE_ENVELOPE_INVALID``), canonical JSON (``RUNTIME_STATE_VALUE_INVALID``), the
  digest (``RUNTIME_STATE_DIGEST_MISMATCH``), then the canonical size
  (``RUNTIME_STATE_ENVELOPE_TOO_LARGE``), so a state that exports also imports.

Port rules D1-D9 are listed in ``tests/conformance/vectors.json``, ``meta.format_notes.port_rules``.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Concatenate, Final, Generic, ParamSpec, TypeVar, cast, final

from pydantic import BaseModel

from .._canonical import canonical_json, canonical_json_of_parsed, digest_of
from .._errors import (
    LifecycleError,
    StateExportError,
    StateInputInvalidError,
    StateTransferFailedError,
)
from ..wire.handoff import (
    CURSOR_PATTERN,
    DIGEST_PATTERN,
    HANDOFF_TEXT_PATTERN,
    MAX_SCHEMA_VERSION,
    MAX_STATE_BYTES,
    StateEnvelope,
    StateHandoffRequest,
    StateImportContext,
)
from ._document import read_document
from ._state_value import accepts, adapter_int, dumped, load, refuse_secret_fields

__all__ = ["Leftovers", "StateCodec"]

T = TypeVar("T", bound=BaseModel)


S = TypeVar("S", bound="StateCodec[Any]")
P = ParamSpec("P")
R = TypeVar("R")

#: Whether :func:`gc_paused_keeping` may promote with ``gc.freeze``/``gc.unfreeze``: two list
#: splices with the default collector, a visit of every object on a free-threaded build.
_PROMOTES: Final = not sysconfig.get_config_var("Py_GIL_DISABLED")


def gc_paused(step: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """Run a synchronous, allocation-heavy step of a codec whose ``pause_collector`` is on with
    the cyclic collector paused; with it off (the default), the step runs as it is.

    Sealing or opening a 1 MiB state allocates hundreds of thousands of containers at once, and
    the collector rescans them again and again. The step never awaits, so no other coroutine
    runs while collection is paused; it is re-enabled (if it was enabled) as soon as the step
    returns or raises. The collector is the whole process's: the app's other threads run
    without it meanwhile, which is why this is the app's choice, off unless it asks.
    """

    return _collector_paused(step, promote=False)


def gc_paused_keeping(step: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """:func:`gc_paused`, for a step whose result (a large typed value) outlives it, or that
    leaves large temporaries to be freed later (:class:`Leftovers`).

    Re-enabled, the collector would scan every container the step made, at the next young
    collection (for a 1 MiB state, ten milliseconds or so, on the way to the acknowledgement),
    then again in the middle generation: they are long-lived state, so they go straight to the
    oldest generation (``gc.freeze`` then ``gc.unfreeze``: no scan), as they would after two
    collections. Whatever else was young goes along, its cycles collected by the next full
    collection instead. Not done when the app froze objects itself (``gc.freeze`` before a
    fork, say): ``unfreeze`` would release them too, and the collector scans the value as
    usual. Nor on a free-threaded build, whose ``freeze`` visits every object.
    """

    return _collector_paused(step, promote=True)


def _collector_paused(
    step: Callable[Concatenate[S, P], R], *, promote: bool
) -> Callable[Concatenate[S, P], R]:
    @functools.wraps(step)
    def paused(codec: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if not codec.pause_collector:
            return step(codec, *args, **kwargs)
        enabled = gc.isenabled()
        gc.disable()
        try:
            return step(codec, *args, **kwargs)
        finally:
            if enabled:
                if promote and _promoted_on_exit():
                    gc.freeze()
                    gc.unfreeze()
                gc.enable()

    return paused


def _promoted_on_exit() -> bool:
    """Whether :func:`gc_paused_keeping`, ending now, can hand what outlives its step to the
    oldest generation, where the collector does not scan it again soon."""
    return _PROMOTES and gc.get_freeze_count() == 0


@final
class Leftovers:
    """A step's large temporaries, kept for the caller to free once its answer is out.

    Freeing what sealing a 1 MiB state leaves behind (the dumped value and the typed value of
    the import check: hundreds of thousands of objects) takes milliseconds. A step given a
    holder leaves them in it, unscanned in the collector's oldest generation
    (:func:`gc_paused_keeping`), and the caller calls :meth:`drop` off the way to its answer:
    after the export's last byte. Where they could not go there unscanned (the codec leaves the
    collector alone, the app froze objects itself, a free-threaded build), the step frees them
    itself, as without a holder: young, they would be scanned by every collection meanwhile.

    One-shot: it holds one step's objects at most, and :meth:`hold` lets go of what it held.
    """

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: tuple[object, ...] = ()

    def __len__(self) -> int:
        """How many objects it holds (0 once dropped)."""
        return len(self._held)

    def hold(self, *objects: object) -> None:
        """Keep ``objects`` (instead of what it held) until :meth:`drop`."""
        self._held = objects

    def drop(self) -> None:
        """Let go of what it holds; what nothing else refers to is freed now."""
        self._held = ()


@final
@dataclass(frozen=True, slots=True)
class StateCodec(Generic[T]):
    """An adapter's checked settings, and the envelope rules that follow from them."""

    protocol: str
    schema_version: int
    maximum_bytes: int
    model: type[T]
    #: Pause the process's cyclic collector while sealing and opening (:func:`gc_paused`).
    pause_collector: bool = False
    #: The SHA-256 of the last value JSON that passed :meth:`_check_imports` (one at most).
    _imports_checked: set[bytes] = field(default_factory=set, compare=False, repr=False)

    @classmethod
    def of(cls, adapter: object, *, pause_collector: bool = False) -> StateCodec[Any]:
        """Check an adapter's settings (``RUNTIME_STATE_ADAPTER_INVALID``) and keep them."""
        protocol = getattr(adapter, "protocol", None)
        if not isinstance(protocol, str) or HANDOFF_TEXT_PATTERN.fullmatch(protocol) is None:
            raise StateInputInvalidError(
                "RUNTIME_STATE_ADAPTER_INVALID",
                "protocol must match " + HANDOFF_TEXT_PATTERN.pattern,
            )
        model = getattr(adapter, "model", None)
        schema_version = adapter_int(getattr(adapter, "schema_version", None), MAX_SCHEMA_VERSION)
        maximum_bytes = adapter_int(getattr(adapter, "maximum_bytes", None), MAX_STATE_BYTES)
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise StateInputInvalidError(
                "RUNTIME_STATE_ADAPTER_INVALID", "model must be a pydantic BaseModel subclass"
            )
        refuse_secret_fields(model)
        return StateCodec(protocol, schema_version, maximum_bytes, model, pause_collector)

    @gc_paused
    def seal(
        self, cursor: object, value: object, source: str, target: str
    ) -> tuple[StateEnvelope, bytes]:
        """The envelope of an exported ``(cursor, value)``, and its canonical JSON document."""
        signed, document = self._seal(cursor, value, source, target, keep_value=True)
        return StateEnvelope.model_validate(signed), document

    @gc_paused_keeping
    def seal_document(
        self,
        cursor: object,
        value: object,
        source: str,
        target: str,
        *,
        leftovers: Leftovers | None = None,
        check_imports: bool = True,
    ) -> tuple[str, bytes]:
        """The digest and canonical JSON document of :meth:`seal`, without the envelope model.

        ``check_imports=False`` leaves out :meth:`_check_imports`, for a requester that makes
        that check itself (a new generation fetching its handoff validates every value).

        Without ``leftovers`` the dumped value dies inside the step, with the import check's
        typed value. With them and ``pause_collector`` on, both are left there, in the oldest
        generation, for the caller to free once the document is sent (:class:`Leftovers`)
        instead of before; with it off, they die inside the step all the same.
        """
        signed, document = self._seal(
            cursor, value, source, target, leftovers, check_imports=check_imports
        )
        return cast("str", signed["digest"]), document

    def _seal(
        self,
        cursor: object,
        value: object,
        source: str,
        target: str,
        leftovers: Leftovers | None = None,
        *,
        keep_value: bool = False,
        check_imports: bool = True,
    ) -> tuple[dict[str, object], bytes]:
        """The signed envelope as JSON data, and its canonical JSON document.

        Unless ``keep_value`` (or ``leftovers`` are to hold it), the dumped value is freed as
        soon as its canonical JSON is made: the import check then builds its typed value
        without it alive (the signed envelope's ``value`` is None then).
        """
        if not isinstance(cursor, str) or CURSOR_PATTERN.fullmatch(cursor) is None:
            raise _export_invalid("the cursor must match " + CURSOR_PATTERN.pattern)
        if not isinstance(value, self.model):
            raise _export_invalid(f"the value must be a {self.model.__name__}")
        data = self._dumped(value)
        unsigned = self._unsigned(cursor, data, source, target, self.schema_version)
        encoded = self._canonical(unsigned, data, _export_invalid("the value fails its model"))
        value_bytes = _value_bytes(unsigned, encoded)
        holding = leftovers is not None and self.pause_collector and _promoted_on_exit()
        if not (keep_value or holding):
            unsigned["value"] = None
            del data
        checked = self._check_imports(value_bytes) if check_imports else None
        if len(encoded) > self.maximum_bytes:
            raise StateExportError(
                "RUNTIME_STATE_EXPORT_TOO_LARGE",
                f"{len(encoded)} bytes of canonical JSON, the limit is {self.maximum_bytes}",
            )
        if holding:
            assert leftovers is not None
            leftovers.hold(data, checked)  # freed after the answer; a refused seal holds nothing
        del checked
        signed = {**unsigned, "digest": digest_of(encoded)}
        # The served document is canonical JSON too; "value" sorts last there as well, so the
        # value's bytes are reused instead of encoding a megabyte again.
        head = {key: item for key, item in signed.items() if key != "value"}
        document = canonical_json(head)[:-1] + b',"value":' + value_bytes + b"}"
        return signed, document

    def _check_imports(self, value_bytes: bytes) -> T | None:
        """Refuse a value whose canonical JSON the model would not import (strict JSON mode).

        Returns the typed value the check built (None when it was not made), for the caller to
        free.

        The check builds, then drops, a second typed value: about as costly as the import
        itself. Its verdict depends only on the model and the bytes, so bytes that passed once
        (the last value's, by SHA-256) pass again without it: a generation that serves the same
        final state twice (an orchestrator's own export, then the new generation's fetch)
        checks it once, and any change to the value makes new bytes, checked before they are
        served. A model whose validators depend on something else (the clock) is checked again
        by the importing side, as every value is.
        """
        fingerprint = hashlib.sha256(value_bytes).digest()
        if fingerprint in self._imports_checked:
            return None
        try:
            checked = load(self.model, value_bytes)
        except ValueError:
            raise _export_invalid("the value's JSON does not validate as its model") from None
        self._imports_checked.clear()
        self._imports_checked.add(fingerprint)
        return checked

    @gc_paused
    def open(
        self, request: StateHandoffRequest, envelope: dict[str, Any]
    ) -> tuple[T, StateImportContext]:
        """The typed value of a fetched envelope and the context to import it with."""
        return self._open(request, envelope, parsed_by_orjson=False, owned=False)

    @gc_paused_keeping
    def open_body(self, request: StateHandoffRequest, body: bytes) -> tuple[T, StateImportContext]:
        """:meth:`open` of a fetched body, read strictly as JSON (:mod:`._document`) first.

        Reading and opening are one step. The parsed envelope is freed as soon as its canonical
        JSON is made, before the value is validated, so the typed value is built in the memory
        it leaves (in a fresh process, fewer new pages to fault in). With ``pause_collector``
        on, the step runs with the collector paused and the typed value, which outlives it,
        goes to the collector's oldest generation unscanned (:func:`gc_paused_keeping`).
        """
        envelope, by_orjson = read_document(body)
        return self._open(request, envelope, parsed_by_orjson=by_orjson, owned=True)

    def _open(
        self,
        request: StateHandoffRequest,
        envelope: dict[str, Any],
        *,
        parsed_by_orjson: bool,
        owned: bool,
    ) -> tuple[T, StateImportContext]:
        """``owned``: the envelope is this step's own, to empty once it is no longer needed."""
        cursor, digest = envelope.get("cursor"), envelope.get("digest")
        schema = envelope.get("schemaVersion")
        if not (
            _is_text(envelope.get("protocol"), request.protocol)
            and isinstance(schema, int | float)
            and not isinstance(schema, bool)
            and schema == request.schema_version
            and _is_text(envelope.get("sourceRevision"), request.source_revision)
            and _is_text(envelope.get("targetRevision"), request.target_revision)
            and isinstance(cursor, str)
            and CURSOR_PATTERN.fullmatch(cursor) is not None
            and isinstance(digest, str)
            and DIGEST_PATTERN.fullmatch(digest) is not None
        ):
            raise _envelope_invalid()
        if "value" not in envelope:
            # The JavaScript module validates `undefined`, then cannot canonicalise it: a model that
            # accepts null (the nearest value it can be asked about) gets VALUE_INVALID, as in the
            # JavaScript module.
            raise _value_invalid() if accepts(self.model, None) else _envelope_invalid()
        value = envelope["value"]
        source, target = request.source_revision, request.target_revision
        unsigned = self._unsigned(cursor, value, source, target, schema)
        encoded = self._canonical(
            unsigned, value, _envelope_invalid(), parsed_by_orjson=parsed_by_orjson
        )
        value_bytes = _value_bytes(unsigned, encoded)
        if owned:
            del value
            unsigned.clear()
            envelope.clear()  # the parsed value is freed here: validation reads the bytes
        try:
            typed = load(self.model, value_bytes)
        except ValueError:
            raise _envelope_invalid() from None
        if digest_of(encoded) != digest:
            raise StateTransferFailedError("RUNTIME_STATE_DIGEST_MISMATCH")
        if len(encoded) > self.maximum_bytes:
            raise StateTransferFailedError("RUNTIME_STATE_ENVELOPE_TOO_LARGE")
        context = StateImportContext(
            source_revision=source, target_revision=target, cursor=cursor, digest=digest
        )
        return typed, context

    def _unsigned(
        self, cursor: str, value: object, source: str, target: str, schema: object
    ) -> dict[str, object]:
        return {
            "protocol": self.protocol,
            "schemaVersion": schema,
            "sourceRevision": source,
            "targetRevision": target,
            "cursor": cursor,
            "value": value,
        }

    def _dumped(self, value: BaseModel) -> Any:
        """The value as JSON data (by alias), checked against its model as the JavaScript module's
        validate.

        pydantic's JSON mode cannot dump some valid JSON (a dict key with a lone surrogate):
        the Python dump is used then, and canonical JSON refuses whatever is not JSON data.
        """
        try:
            return dumped(value)
        except Exception:
            pass
        try:
            data = value.model_dump(by_alias=True)
        except Exception:
            raise _value_invalid() from None
        if not accepts(self.model, data):
            raise _export_invalid("the value fails its model")
        return data

    def _canonical(
        self,
        unsigned: object,
        value: object,
        refused: LifecycleError,
        *,
        parsed_by_orjson: bool = False,
    ) -> bytes:
        """canonical_json of ``unsigned``; a value the model refuses fails as ``refused`` first.

        ``parsed_by_orjson``: ``unsigned`` holds what ``orjson.loads`` returned (and fields
        of the request), so :func:`canonical_json_of_parsed` gives the same bytes faster.
        """
        encode = canonical_json_of_parsed if parsed_by_orjson else canonical_json
        try:
            return encode(unsigned)
        except StateInputInvalidError:
            if not accepts(self.model, value):
                raise refused from None
            raise


def _value_bytes(unsigned: dict[str, object], encoded: bytes) -> bytes:
    """The canonical JSON of ``unsigned["value"]``, cut from the envelope's own encoding.

    ``value`` sorts last among the envelope's keys, so its encoding is what follows the
    encoding of the other fields: one canonicalisation serves size, digest and validation.
    """
    rest = {key: item for key, item in unsigned.items() if key != "value"}
    prefix = canonical_json(rest)[:-1] + b',"value":'
    if not encoded.startswith(prefix):  # pragma: no cover - canonical JSON sorts "value" last
        raise AssertionError("the envelope's encoding does not end with its value")
    return encoded[len(prefix) : -1]


def _is_text(value: object, expected: str) -> bool:
    return isinstance(value, str) and value == expected


def _export_invalid(detail: str) -> StateExportError:
    return StateExportError("RUNTIME_STATE_EXPORT_INVALID", detail)


def _envelope_invalid() -> StateTransferFailedError:
    return StateTransferFailedError("RUNTIME_STATE_ENVELOPE_INVALID")


def _value_invalid() -> StateInputInvalidError:
    return StateInputInvalidError("RUNTIME_STATE_VALUE_INVALID")
