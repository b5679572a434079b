"""One exception tree for the whole library; every error carries a stable ``code``.

The codes are the JavaScript `@forgezero/runtime` lifecycle module's wire strings (``RUNTIME_*``)
plus the library's own (``QUEUE_*``, ``JOB_*``, ``SCHEDULE_*``). Bad input subclasses
:class:`ValueError`, a call in the wrong state subclasses :class:`RuntimeError`, an unknown name
subclasses :class:`LookupError`. Every class name ends in ``Error`` (PEP 8; ruff's N818
checks it) and says in words what its code says (``DrainNotFoundError``,
``RUNTIME_DRAIN_NOT_FOUND``)::

    LifecycleError                                      .code, .detail
    ├── ConfigurationError (ValueError)                 RUNTIME_CONFIG_INVALID
    ├── DrainError
    │   ├── DrainRequestInvalidError (ValueError)       RUNTIME_DRAIN_REQUEST_INVALID
    │   ├── DrainConflictError (RuntimeError)           RUNTIME_DRAIN_ALREADY_STARTED
    │   │                                               | _REVISION_MISMATCH | _SHARED_LISTENER
    │   │                                               | _GENERATION_RETIRING
    │   ├── DrainNotFoundError (LookupError)            RUNTIME_DRAIN_NOT_FOUND
    │   ├── DrainCountersInvalidError (ValueError)      RUNTIME_DRAIN_COUNTERS_INVALID
    │   ├── DrainFailedError (RuntimeError)             RUNTIME_DRAIN_TIMEOUT | _NOT_IDLE | _FAILED
    │   ├── ConnectionClosedByDrainError (OSError)      RUNTIME_DRAIN_CONNECTION_CLOSED | _ABANDONED
    │   │                                               | _RESPONSE_CUT
    │   └── DrainingError (RuntimeError)                RUNTIME_DRAINING
    ├── StateError
    │   ├── StateInputInvalidError (ValueError)         RUNTIME_STATE_REQUEST_INVALID
    │   │                                               | _SOURCE_INVALID | _REVISION_INVALID
    │   │                                               | _VALUE_INVALID | _ADAPTER_INVALID
    │   ├── StateConflictError (RuntimeError)           RUNTIME_STATE_ALREADY_STARTED
    │   │                                               | _NOT_DRAINING | _REVISION_MISMATCH
    │   ├── StateNotFoundError (LookupError)            RUNTIME_STATE_NOT_FOUND
    │   ├── StateExportError (ValueError)               RUNTIME_STATE_EXPORT_INVALID
    │   │                                               | _EXPORT_TOO_LARGE
    │   └── StateTransferFailedError (RuntimeError)     RUNTIME_STATE_SOURCE_HTTP_<status>
    │                                                   | _SOURCE_TOO_LARGE | _SOURCE_UNREACHABLE
    │                                                   | _TIMEOUT | _ENVELOPE_INVALID
    │                                                   | _ENVELOPE_TOO_LARGE | _DIGEST_MISMATCH
    │                                                   | _FAILED
    ├── ControlError    (control-plane HTTP errors, mapped to 4xx by the control app)
    │   ├── UnauthorizedError                           RUNTIME_UNAUTHORIZED
    │   ├── BodyTooLargeError (ValueError)              RUNTIME_BODY_TOO_LARGE
    │   ├── BodyTimeoutError (ValueError)               RUNTIME_BODY_TIMEOUT
    │   ├── ContentTypeInvalidError (ValueError)        RUNTIME_CONTENT_TYPE
    │   ├── ControlPathNotFoundError (LookupError)      RUNTIME_NOT_FOUND
    │   ├── MethodNotAllowedError                       RUNTIME_METHOD_NOT_ALLOWED (.allow)
    │   ├── ReloadBusyError (RuntimeError)              RUNTIME_RELOAD_BUSY
    │   ├── ScaleRefusedError (RuntimeError)            RUNTIME_SCALE_REFUSED
    │   ├── ControlUnreachableError (ConnectionError)   RUNTIME_UNREACHABLE (client side only)
    │   └── RemoteError                                 any code this client does not know
    ├── QueueError (RuntimeError)
    │   ├── QueueStoppedError                           QUEUE_STOPPED
    │   ├── QueueIntakePausedError                      QUEUE_INTAKE_PAUSED
    │   ├── QueueKeyStoppedError                        QUEUE_KEY_STOPPED (.key)
    │   └── TaskCancelledError                          QUEUE_TASK_CANCELLED
    ├── ScheduleError
    │   ├── ScheduleInvalidError (ValueError)           SCHEDULE_INVALID
    │   ├── ScheduleNotFoundError (LookupError)         SCHEDULE_NOT_FOUND
    │   └── ScheduleIntakePausedError (RuntimeError)    SCHEDULE_INTAKE_PAUSED
    └── JobError
        ├── JobInvalidError (ValueError)                JOB_INVALID (bad enqueue arguments)
        ├── JobStateError (RuntimeError)                JOB_STATE_INVALID (a call out of order)
        ├── IdempotencyConflictError (ValueError)       JOB_IDEMPOTENCY_CONFLICT
        ├── LeaseLostError (RuntimeError)               JOB_LEASE_LOST
        ├── JobHandlerUnknownError (LookupError)        JOB_HANDLER_UNKNOWN
        └── JobStoreError (RuntimeError)                JOB_STORE_UNAVAILABLE | JOB_STORE_SCHEMA

Messages never contain a token or a handoff value.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "BodyTimeoutError",
    "BodyTooLargeError",
    "ConfigurationError",
    "ConnectionClosedByDrainError",
    "ContentTypeInvalidError",
    "ControlError",
    "ControlPathNotFoundError",
    "ControlUnreachableError",
    "DrainConflictError",
    "DrainCountersInvalidError",
    "DrainError",
    "DrainFailedError",
    "DrainNotFoundError",
    "DrainRequestInvalidError",
    "DrainingError",
    "IdempotencyConflictError",
    "JobError",
    "JobHandlerUnknownError",
    "JobInvalidError",
    "JobStateError",
    "JobStoreError",
    "LeaseLostError",
    "LifecycleError",
    "MethodNotAllowedError",
    "QueueError",
    "QueueIntakePausedError",
    "QueueKeyStoppedError",
    "QueueStoppedError",
    "ReloadBusyError",
    "RemoteError",
    "ScaleRefusedError",
    "ScheduleError",
    "ScheduleIntakePausedError",
    "ScheduleInvalidError",
    "ScheduleNotFoundError",
    "StateConflictError",
    "StateError",
    "StateExportError",
    "StateInputInvalidError",
    "StateNotFoundError",
    "StateTransferFailedError",
    "TaskCancelledError",
    "UnauthorizedError",
    "error_for_code",
]


class LifecycleError(Exception):
    """Base of every error the library raises on purpose.

    ``code`` is stable and safe to show to a client; ``detail`` is an optional human sentence
    saying what happened and what to do (never a secret).
    """

    code: str
    #: The codes an error class may carry; the first one is its default.
    codes: ClassVar[tuple[str, ...]] = ("RUNTIME_FAILED",)
    #: Codes accepted by prefix (``RUNTIME_STATE_SOURCE_HTTP_404``).
    code_prefixes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, code: str | None = None, detail: str | None = None) -> None:
        code = self.codes[0] if code is None else code
        if code not in self.codes and not (
            self.code_prefixes and code.startswith(self.code_prefixes)
        ):
            raise TypeError(f"{type(self).__name__} cannot carry code {code!r}")
        self.code = code
        self.detail = detail
        super().__init__(code if detail is None else f"{code}: {detail}")


class ConfigurationError(LifecycleError, ValueError):
    codes = ("RUNTIME_CONFIG_INVALID",)


class DrainError(LifecycleError):
    """Errors of the drain protocol."""


class DrainRequestInvalidError(DrainError, ValueError):
    codes = ("RUNTIME_DRAIN_REQUEST_INVALID",)


class DrainConflictError(DrainError, RuntimeError):
    codes = (
        "RUNTIME_DRAIN_ALREADY_STARTED",
        "RUNTIME_DRAIN_REVISION_MISMATCH",
        "RUNTIME_DRAIN_SHARED_LISTENER",
        "RUNTIME_DRAIN_GENERATION_RETIRING",
    )


class DrainNotFoundError(DrainError, LookupError):
    codes = ("RUNTIME_DRAIN_NOT_FOUND",)


class DrainCountersInvalidError(DrainError, ValueError):
    codes = ("RUNTIME_DRAIN_COUNTERS_INVALID",)


class DrainFailedError(DrainError, RuntimeError):
    codes = ("RUNTIME_DRAIN_FAILED", "RUNTIME_DRAIN_TIMEOUT", "RUNTIME_DRAIN_NOT_IDLE")


class ConnectionClosedByDrainError(DrainError, OSError):
    """An app's ``send`` on a connection the drain has ended (raised by the in-flight middleware).

    The ASGI spec's rule for a send on a closed connection: an :class:`OSError` subclass, which
    Starlette turns into ``WebSocketDisconnect`` (or ``ClientDisconnect`` for a response).

    * ``RUNTIME_DRAIN_CONNECTION_CLOSED``: the stream notice closed this WebSocket (code 1012);
    * ``RUNTIME_DRAIN_CONNECTION_ABANDONED``: a send was still blocked by a client that does not
      read when the drain's release margin came, so the drain gave up on the connection;
    * ``RUNTIME_DRAIN_RESPONSE_CUT``: the drain ended a response before its last part, under a
      server the middleware cannot end it under itself (raised so that the server closes the
      connection and the client sees the body incomplete).
    """

    codes = (
        "RUNTIME_DRAIN_CONNECTION_CLOSED",
        "RUNTIME_DRAIN_CONNECTION_ABANDONED",
        "RUNTIME_DRAIN_RESPONSE_CUT",
    )


class DrainingError(DrainError, RuntimeError):
    """Work offered once the drain closed intake (``Runtime.create_task``, ``Runtime.hold``):
    refused, never started. Start it before the drain, or hand it to the next generation."""

    codes = ("RUNTIME_DRAINING",)


class StateError(LifecycleError):
    """Errors of the typed state handoff."""


class StateInputInvalidError(StateError, ValueError):
    codes = (
        "RUNTIME_STATE_REQUEST_INVALID",
        "RUNTIME_STATE_SOURCE_INVALID",
        "RUNTIME_STATE_REVISION_INVALID",
        "RUNTIME_STATE_VALUE_INVALID",
        "RUNTIME_STATE_ADAPTER_INVALID",
    )


class StateConflictError(StateError, RuntimeError):
    codes = (
        "RUNTIME_STATE_ALREADY_STARTED",
        "RUNTIME_STATE_NOT_DRAINING",
        "RUNTIME_STATE_REVISION_MISMATCH",
    )


class StateNotFoundError(StateError, LookupError):
    codes = ("RUNTIME_STATE_NOT_FOUND",)


class StateExportError(StateError, ValueError):
    codes = ("RUNTIME_STATE_EXPORT_INVALID", "RUNTIME_STATE_EXPORT_TOO_LARGE")


class StateTransferFailedError(StateError, RuntimeError):
    codes = (
        "RUNTIME_STATE_FAILED",
        "RUNTIME_STATE_SOURCE_TOO_LARGE",
        "RUNTIME_STATE_SOURCE_UNREACHABLE",
        "RUNTIME_STATE_TIMEOUT",
        "RUNTIME_STATE_ENVELOPE_INVALID",
        "RUNTIME_STATE_ENVELOPE_TOO_LARGE",
        "RUNTIME_STATE_DIGEST_MISMATCH",
    )
    code_prefixes = ("RUNTIME_STATE_SOURCE_HTTP_",)


class ControlError(LifecycleError):
    """Errors of the control plane's HTTP surface."""


class UnauthorizedError(ControlError):
    codes = ("RUNTIME_UNAUTHORIZED",)


class BodyTooLargeError(ControlError, ValueError):
    codes = ("RUNTIME_BODY_TOO_LARGE",)


class BodyTimeoutError(ControlError, ValueError):
    """A control body that did not arrive in time (a client trickling it, or one that stalled)."""

    codes = ("RUNTIME_BODY_TIMEOUT",)


class ContentTypeInvalidError(ControlError, ValueError):
    codes = ("RUNTIME_CONTENT_TYPE",)


class ControlPathNotFoundError(ControlError, LookupError):
    codes = ("RUNTIME_NOT_FOUND",)


class MethodNotAllowedError(ControlError):
    codes = ("RUNTIME_METHOD_NOT_ALLOWED",)

    def __init__(self, allow: str) -> None:
        self.allow = allow
        super().__init__(detail=f"use {allow}")


class ReloadBusyError(ControlError, RuntimeError):
    """A reload while a handover or the stop runs (``serve --workers``)."""

    codes = ("RUNTIME_RELOAD_BUSY",)


class ScaleRefusedError(ControlError, RuntimeError):
    """A scaling the supervisor cannot make now: during its start, a handover, a drain or the
    stop, or past 1 to its most workers (``serve --workers``)."""

    codes = ("RUNTIME_SCALE_REFUSED",)


class ControlUnreachableError(ControlError, ConnectionError):
    codes = ("RUNTIME_UNREACHABLE",)


class RemoteError(ControlError):
    """A server answered with a code this client does not know (a newer server)."""

    codes = ("RUNTIME_FAILED",)
    code_prefixes = ("",)


class QueueError(LifecycleError, RuntimeError):
    """Refusals and cancellations of the keyed work queue."""


class QueueStoppedError(QueueError):
    codes = ("QUEUE_STOPPED",)

    def __init__(self) -> None:
        super().__init__(detail="the queue is stopped and accepts no new work")


class QueueIntakePausedError(QueueError):
    codes = ("QUEUE_INTAKE_PAUSED",)

    def __init__(self) -> None:
        super().__init__(
            detail="intake is paused for a runtime handoff; submit to the new generation"
        )


class QueueKeyStoppedError(QueueError):
    codes = ("QUEUE_KEY_STOPPED",)

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(detail=f"key {key!r} is stopped and accepts no new work")


class TaskCancelledError(QueueError):
    codes = ("QUEUE_TASK_CANCELLED",)

    def __init__(self, detail: str = "the task was cancelled before it ran") -> None:
        super().__init__(detail=detail)


class ScheduleError(LifecycleError):
    """Errors of the scheduler."""


class ScheduleInvalidError(ScheduleError, ValueError):
    codes = ("SCHEDULE_INVALID",)


class ScheduleNotFoundError(ScheduleError, LookupError):
    codes = ("SCHEDULE_NOT_FOUND",)


class ScheduleIntakePausedError(ScheduleError, RuntimeError):
    codes = ("SCHEDULE_INTAKE_PAUSED",)


class JobError(LifecycleError):
    """Errors of durable fenced jobs."""


class IdempotencyConflictError(JobError, ValueError):
    codes = ("JOB_IDEMPOTENCY_CONFLICT",)


class LeaseLostError(JobError, RuntimeError):
    codes = ("JOB_LEASE_LOST",)


class JobInvalidError(JobError, ValueError):
    codes = ("JOB_INVALID",)


class JobStateError(JobError, RuntimeError):
    codes = ("JOB_STATE_INVALID",)


class JobHandlerUnknownError(JobError, LookupError):
    codes = ("JOB_HANDLER_UNKNOWN",)


class JobStoreError(JobError, RuntimeError):
    codes = ("JOB_STORE_UNAVAILABLE", "JOB_STORE_SCHEMA")


def _index() -> tuple[dict[str, type[LifecycleError]], list[tuple[str, type[LifecycleError]]]]:
    """Every code (and code prefix) to the class that carries it, for :func:`error_for_code`."""
    by_code: dict[str, type[LifecycleError]] = {}
    by_prefix: list[tuple[str, type[LifecycleError]]] = []
    pending = list(LifecycleError.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls is RemoteError or cls.__init__ is not LifecycleError.__init__:
            continue  # the catch-all, and classes built from other arguments than a code
        if "codes" in cls.__dict__:
            by_code.update(dict.fromkeys(cls.codes, cls))
        if "code_prefixes" in cls.__dict__:
            by_prefix.extend((prefix, cls) for prefix in cls.code_prefixes)
    return by_code, by_prefix


_BY_CODE, _BY_PREFIX = _index()


def error_for_code(code: str, detail: str | None = None) -> LifecycleError:
    """Rebuild the typed error for a wire ``code`` (used by the client on error bodies)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = next((c for prefix, c in _BY_PREFIX if code.startswith(prefix)), RemoteError)
    return cls(code, detail)
