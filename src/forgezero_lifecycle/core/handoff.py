"""Typed state handoff: ``RuntimeStateHandoffController`` with a pydantic adapter.

The controller is the JavaScript `@forgezero/runtime` lifecycle module's.

The old generation serves its state through :meth:`StateHandoffController.export_state` (the
control app's export endpoint); the new generation is told by the orchestrator to
:meth:`~StateHandoffController.begin` fetching it. The transfer is typed (a pydantic model),
versioned (``protocol`` and ``schema_version`` must match), size-bounded (``maximum_bytes`` of
canonical JSON, the same limit on export and import), digest-checked, fetched only from a
loopback ``http`` URL, never through a redirect, within one deadline, and imported exactly once.
The orchestrator only ever sees the cursor and digest, never the value.

The JavaScript module's codes, and the port rules D1-D9 of the conformance vectors
(``tests/conformance/vectors.json``, ``meta.format_notes.port_rules``), apply throughout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar, cast, final

from pydantic import BaseModel, ValidationError

from .._clock import Clock, SystemClock
from .._errors import (
    LifecycleError,
    StateConflictError,
    StateExportError,
    StateInputInvalidError,
    StateNotFoundError,
    StateTransferFailedError,
)
from .._events import emit, nonce_prefix
from .._race import first
from ..wire._protocol import deadline_problem
from ..wire._types import is_nonce, is_revision, safe_int
from ..wire.handoff import (
    SOURCE_SLACK_BYTES,
    StateEnvelope,
    StateHandoffRequest,
    StateHandoffStatus,
    StateImportContext,
)
from ._codec import Leftovers, StateCodec
from ._loopback import loopback_source
from ._state_value import failure_text

if TYPE_CHECKING:
    import httpx

__all__ = ["HandoffStatistics", "StateAdapter", "StateHandoffController"]

T = TypeVar("T", bound=BaseModel)
R = TypeVar("R")

logger = logging.getLogger("forgezero_lifecycle.handoff")


class _Fetch(Protocol):
    """:func:`._fetch.fetch_body`'s signature."""

    def __call__(
        self,
        url: str,
        authorization: str,
        *,
        transport: httpx.AsyncBaseTransport | None,
        limit: int,
    ) -> Awaitable[bytes]: ...


@final
@dataclass(frozen=True, slots=True)
class HandoffStatistics:
    """A snapshot of one controller's handoffs, for metrics (nothing in it is secret)."""

    #: State envelopes served to a next generation, and their bytes.
    exported: int = 0
    exported_bytes: int = 0
    #: Handoffs into this generation, by outcome.
    acknowledged: int = 0
    failed: int = 0


class StateAdapter(Protocol[T]):
    """What the application provides: its state as a pydantic model, exported and imported.

    ``model`` must not contain ``SecretStr``/``SecretBytes``/``Secret`` fields at any depth.
    """

    @property
    def protocol(self) -> str:
        """A name matching ``[A-Za-z0-9][A-Za-z0-9_.:@/-]{0,127}``, such as ``demo.counter``."""
        ...

    @property
    def schema_version(self) -> int:
        """1 to 65535; both generations must agree."""
        ...

    @property
    def maximum_bytes(self) -> int:
        """Limit of the canonical JSON of the unsigned envelope, 1 to 1 MiB."""
        ...

    @property
    def model(self) -> type[T]:
        """The pydantic model of the value."""
        ...

    async def export_state(self) -> tuple[str, T]:
        """Return ``(cursor, value)``; called once intake is closed."""
        ...

    async def import_state(self, value: T, context: StateImportContext) -> None:
        """Install the validated value; called at most once per controller."""
        ...


@final
class StateHandoffController(Generic[T]):
    """One handoff per process: an exact retry of ``begin`` is a duplicate, anything else is
    ``RUNTIME_STATE_ALREADY_STARTED``. The fetch runs in a task the controller owns.
    """

    def __init__(
        self,
        adapter: StateAdapter[T],
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Clock | None = None,
        revision: str | None = None,
        prepare_fetch: bool = True,
        pause_collector: bool = False,
    ) -> None:
        """``prepare_fetch``: build the fetch (httpx and its loopback transport) now, at
        start-up, so that a handoff never waits for the import (about 100 ms and 6 MiB resident
        in a fresh process). False: build it on the first :meth:`begin`, inside that handoff's
        deadline, for a generation that is not expected to receive state.

        ``pause_collector``: pause the process's cyclic collector while a state is sealed or
        opened, and hand the typed value to its oldest generation (``core._codec.gc_paused``).
        Off by default: the collector is the whole process's.
        """
        self._revision = revision
        self._codec: StateCodec[T] = cast(
            "StateCodec[T]", StateCodec.of(adapter, pause_collector=pause_collector)
        )
        self._adapter = adapter
        self._transport = transport
        self._fetch: _Fetch | None = None
        if prepare_fetch:
            self._prepared_fetch()
        self._clock: Clock = SystemClock() if clock is None else clock
        self._request: StateHandoffRequest | None = None
        self._status: StateHandoffStatus | None = None
        self._task: asyncio.Task[None] | None = None
        self._settled = asyncio.Event()
        #: What the last export_document left to free after its response (release_export).
        self._export_leftovers = Leftovers()
        # Plain ints, touched once per export or handoff, read at scrape time (statistics()).
        self._counts = {"exported": 0, "exported_bytes": 0, "acknowledged": 0, "failed": 0}

    @property
    def protocol(self) -> str:
        """The state adapter's protocol (what a handoff's ``protocol`` must name)."""
        return self._codec.protocol

    @property
    def schema_version(self) -> int:
        """The state adapter's schema version."""
        return self._codec.schema_version

    # -- the old generation: export -----------------------------------------------------------

    async def export_state(self, source_revision: object, target_revision: object) -> StateEnvelope:
        """The signed envelope of the adapter's current state."""
        cursor, value, source, target = await self._exported(source_revision, target_revision)
        envelope, document = self._codec.seal(cursor, value, source, target)
        self._exported_as(target, envelope.digest, len(document))
        return envelope

    async def export_document(
        self, source_revision: object, target_revision: object, *, check_imports: bool = True
    ) -> bytes:
        """The same envelope as canonical JSON bytes, as the export endpoint serves it.

        ``check_imports=False`` leaves out the check that the value's JSON imports as its model
        (``RUNTIME_STATE_EXPORT_INVALID``): for a requester that validates it itself, as a new
        generation fetching its handoff does, so that the value is validated once, not twice.

        With ``pause_collector`` on, the sealing step's large temporaries (the dumped value, the
        import check's typed value) are kept, unscanned by the collector, until
        :meth:`release_export`: call it once the document is sent, so that freeing them is not
        on the way to the response. The next export, and :meth:`aclose`, let go of them too.
        With it off they are freed inside the step.
        """
        self._export_leftovers.drop()
        cursor, value, source, target = await self._exported(source_revision, target_revision)
        # No envelope model: nothing the sealing step made but the document outlives the export.
        digest, document = self._codec.seal_document(
            cursor,
            value,
            source,
            target,
            leftovers=self._export_leftovers,
            check_imports=check_imports,
        )
        self._exported_as(target, digest, len(document))
        return document

    def release_export(self) -> None:
        """Free what the last :meth:`export_document` kept for after its response."""
        self._export_leftovers.drop()

    async def _exported(
        self, source_revision: object, target_revision: object
    ) -> tuple[object, object, str, str]:
        """The adapter's ``(cursor, value)`` for checked revisions, and the revisions."""
        if not is_revision(source_revision):
            raise StateInputInvalidError("RUNTIME_STATE_REVISION_INVALID")
        if not is_revision(target_revision):
            raise StateInputInvalidError("RUNTIME_STATE_REVISION_INVALID")
        if self._revision is not None and source_revision != self._revision:
            raise StateConflictError(
                "RUNTIME_STATE_REVISION_MISMATCH",
                "sourceRevision is not the revision this generation runs",
            )
        try:
            cursor, value = await self._adapter.export_state()
        except LifecycleError:
            raise
        except Exception as exc:
            raise _export_invalid(f"export_state raised {type(exc).__name__}") from exc
        return cursor, value, source_revision, target_revision

    def _exported_as(self, target_revision: str, digest: str, size: int) -> None:
        self._counts["exported"] += 1
        self._counts["exported_bytes"] += size
        emit(
            logger,
            logging.INFO,
            "handoff.exported",
            target_revision=target_revision,
            bytes=size,
            digest=digest,
        )

    # -- the new generation: begin, status -----------------------------------------------------

    def begin(self, request: object, timeout_ms: object) -> dict[str, bool]:
        """Validate, then start fetching in the background; never blocks. Needs a running loop."""
        parsed = _parsed_request(request)
        try:
            timeout = safe_int(timeout_ms)
        except ValueError:
            timeout = 0
        if (
            parsed.protocol != self._codec.protocol
            or parsed.schema_version != self._codec.schema_version
            or deadline_problem(timeout) is not None
        ):
            raise StateInputInvalidError("RUNTIME_STATE_REQUEST_INVALID")
        url = loopback_source(parsed.source.url)
        if self._request is not None:
            if parsed != self._request:
                raise StateConflictError("RUNTIME_STATE_ALREADY_STARTED")
            return {"accepted": True, "duplicate": True}
        loop = asyncio.get_running_loop()
        self._request = parsed
        self._status = _status(parsed, "pending")
        self._task = loop.create_task(self._run(parsed, url, timeout / 1000))
        emit(
            logger,
            logging.INFO,
            "handoff.begin",
            nonce_prefix=nonce_prefix(parsed.nonce),
            protocol=parsed.protocol,
            schema_version=parsed.schema_version,
            source_revision=parsed.source_revision,
            timeout_ms=timeout,
        )
        return {"accepted": True, "duplicate": False}

    def status(self, nonce: object) -> StateHandoffStatus:
        if self._status is None or not is_nonce(nonce) or nonce != self._status.nonce:
            raise StateNotFoundError("RUNTIME_STATE_NOT_FOUND")
        return self._status

    def statistics(self) -> HandoffStatistics:
        """Exports served (and their bytes) and handoffs into this generation by outcome."""
        return HandoffStatistics(**self._counts)

    async def wait(self, nonce: object) -> StateHandoffStatus:
        """Return the status once the handoff of ``nonce`` is acknowledged or failed."""
        self.status(nonce)
        await self._settled.wait()
        return self.status(nonce)

    async def aclose(self) -> None:
        """Cancel a fetch or import still running (it ends failed); idempotent."""
        self._export_leftovers.drop()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait({self._task})

    # -- internals ------------------------------------------------------------------------------

    def _prepared_fetch(self) -> _Fetch:
        """The fetch, built on first use: one transport for the controller's lifetime.

        The fetch is plain http to loopback, so no CA bundle is loaded. httpx (about 5 MiB
        resident) is imported here, by a runtime that receives state, not by every runtime that
        imports this module.
        """
        if self._fetch is None:
            from . import _fetch

            if self._transport is None:
                self._transport = _fetch.loopback_transport()
            self._fetch = _fetch.fetch_body
        return self._fetch

    async def _fetched(self, url: str, authorization: str, limit: int) -> bytes:
        fetch = self._prepared_fetch()  # an import, if not prepared: inside the deadline
        return await fetch(url, authorization, transport=self._transport, limit=limit)

    async def _run(self, request: StateHandoffRequest, url: str, seconds: float) -> None:
        try:
            limit = self._codec.maximum_bytes + SOURCE_SLACK_BYTES
            auth = request.source.authorization
            body = await self._within(self._fetched(url, auth, limit), seconds)
            emit(logger, logging.INFO, "handoff.fetched", nonce_prefix=nonce_prefix(request.nonce))
            value, context = self._codec.open_body(request, body)
            try:
                await self._adapter.import_state(value, context)
            except LifecycleError:
                raise
            except Exception as exc:
                self._settle(request, "failed", failure_text(str(exc)) or "RUNTIME_STATE_FAILED")
                return
            self._settle(request, "acknowledged", cursor=context.cursor, digest=context.digest)
        except asyncio.CancelledError:
            self._settle(request, "failed", "RUNTIME_STATE_FAILED")
            raise
        except LifecycleError as exc:
            self._settle(request, "failed", exc.code)
        except Exception:
            logger.exception("handoff.internal_error nonce_prefix=%s", nonce_prefix(request.nonce))
            self._settle(request, "failed", "RUNTIME_STATE_FAILED")

    def _settle(
        self, request: StateHandoffRequest, status: str, failure: str | None = None, **extra: str
    ) -> None:
        self._status = _status(request, status, failure=failure, **extra)
        self._settled.set()
        self._counts["acknowledged" if status == "acknowledged" else "failed"] += 1
        if status == "acknowledged":
            emit(
                logger,
                logging.INFO,
                "handoff.acknowledged",
                nonce_prefix=nonce_prefix(request.nonce),
                cursor=extra.get("cursor"),
                digest=extra.get("digest"),
            )
        else:
            emit(
                logger,
                logging.WARNING,
                "handoff.failed",
                nonce_prefix=nonce_prefix(request.nonce),
                failure=failure,
            )

    async def _within(self, work: Awaitable[R], seconds: float) -> R:
        """``work`` raced against the clock; on the deadline it is cancelled and awaited."""
        task = await first(work, self._clock.sleep(seconds))
        if task.cancelled():
            raise StateTransferFailedError("RUNTIME_STATE_TIMEOUT")
        return task.result()


def _parsed_request(request: object) -> StateHandoffRequest:
    if isinstance(request, StateHandoffRequest):
        return request
    if not isinstance(request, dict):
        raise StateInputInvalidError(
            "RUNTIME_STATE_REQUEST_INVALID", "the request must be an object"
        )
    try:
        return StateHandoffRequest.model_validate(request, by_alias=True, by_name=False)
    except ValidationError:
        raise StateInputInvalidError("RUNTIME_STATE_REQUEST_INVALID") from None


def _status(request: StateHandoffRequest, status: str, **extra: str | None) -> StateHandoffStatus:
    return StateHandoffStatus.model_validate(
        {
            "protocol": request.protocol,
            "nonce": request.nonce,
            "schemaVersion": request.schema_version,
            "sourceRevision": request.source_revision,
            "targetRevision": request.target_revision,
            "status": status,
            **extra,
        }
    )


def _export_invalid(detail: str) -> StateExportError:
    return StateExportError("RUNTIME_STATE_EXPORT_INVALID", detail)
