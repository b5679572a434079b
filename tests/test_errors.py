"""The exception tree and its stable codes are part of the public contract."""

from __future__ import annotations

import pytest

from forgezero_lifecycle import _errors as errors

#: Every class, its direct library parent, its builtin base (if any) and its codes.
TREE = {
    "ConfigurationError": ("LifecycleError", ValueError, ("RUNTIME_CONFIG_INVALID",)),
    "DrainRequestInvalidError": ("DrainError", ValueError, ("RUNTIME_DRAIN_REQUEST_INVALID",)),
    "DrainConflictError": (
        "DrainError",
        RuntimeError,
        (
            "RUNTIME_DRAIN_ALREADY_STARTED",
            "RUNTIME_DRAIN_REVISION_MISMATCH",
            "RUNTIME_DRAIN_SHARED_LISTENER",
            "RUNTIME_DRAIN_GENERATION_RETIRING",
        ),
    ),
    "DrainNotFoundError": ("DrainError", LookupError, ("RUNTIME_DRAIN_NOT_FOUND",)),
    "DrainCountersInvalidError": ("DrainError", ValueError, ("RUNTIME_DRAIN_COUNTERS_INVALID",)),
    "DrainFailedError": (
        "DrainError",
        RuntimeError,
        ("RUNTIME_DRAIN_FAILED", "RUNTIME_DRAIN_TIMEOUT", "RUNTIME_DRAIN_NOT_IDLE"),
    ),
    "ConnectionClosedByDrainError": (
        "DrainError",
        OSError,
        (
            "RUNTIME_DRAIN_CONNECTION_CLOSED",
            "RUNTIME_DRAIN_CONNECTION_ABANDONED",
            "RUNTIME_DRAIN_RESPONSE_CUT",
        ),
    ),
    "DrainingError": ("DrainError", RuntimeError, ("RUNTIME_DRAINING",)),
    "StateInputInvalidError": (
        "StateError",
        ValueError,
        (
            "RUNTIME_STATE_REQUEST_INVALID",
            "RUNTIME_STATE_SOURCE_INVALID",
            "RUNTIME_STATE_REVISION_INVALID",
            "RUNTIME_STATE_VALUE_INVALID",
            "RUNTIME_STATE_ADAPTER_INVALID",
        ),
    ),
    "StateConflictError": (
        "StateError",
        RuntimeError,
        (
            "RUNTIME_STATE_ALREADY_STARTED",
            "RUNTIME_STATE_NOT_DRAINING",
            "RUNTIME_STATE_REVISION_MISMATCH",
        ),
    ),
    "StateNotFoundError": ("StateError", LookupError, ("RUNTIME_STATE_NOT_FOUND",)),
    "StateExportError": (
        "StateError",
        ValueError,
        ("RUNTIME_STATE_EXPORT_INVALID", "RUNTIME_STATE_EXPORT_TOO_LARGE"),
    ),
    "StateTransferFailedError": (
        "StateError",
        RuntimeError,
        (
            "RUNTIME_STATE_FAILED",
            "RUNTIME_STATE_SOURCE_TOO_LARGE",
            "RUNTIME_STATE_SOURCE_UNREACHABLE",
            "RUNTIME_STATE_TIMEOUT",
            "RUNTIME_STATE_ENVELOPE_INVALID",
            "RUNTIME_STATE_ENVELOPE_TOO_LARGE",
            "RUNTIME_STATE_DIGEST_MISMATCH",
        ),
    ),
    "UnauthorizedError": ("ControlError", None, ("RUNTIME_UNAUTHORIZED",)),
    "BodyTooLargeError": ("ControlError", ValueError, ("RUNTIME_BODY_TOO_LARGE",)),
    "BodyTimeoutError": ("ControlError", ValueError, ("RUNTIME_BODY_TIMEOUT",)),
    "ReloadBusyError": ("ControlError", RuntimeError, ("RUNTIME_RELOAD_BUSY",)),
    "ScaleRefusedError": ("ControlError", RuntimeError, ("RUNTIME_SCALE_REFUSED",)),
    "ContentTypeInvalidError": ("ControlError", ValueError, ("RUNTIME_CONTENT_TYPE",)),
    "ControlPathNotFoundError": ("ControlError", LookupError, ("RUNTIME_NOT_FOUND",)),
    "ControlUnreachableError": ("ControlError", ConnectionError, ("RUNTIME_UNREACHABLE",)),
    "ScheduleInvalidError": ("ScheduleError", ValueError, ("SCHEDULE_INVALID",)),
    "ScheduleNotFoundError": ("ScheduleError", LookupError, ("SCHEDULE_NOT_FOUND",)),
    "ScheduleIntakePausedError": ("ScheduleError", RuntimeError, ("SCHEDULE_INTAKE_PAUSED",)),
    "IdempotencyConflictError": ("JobError", ValueError, ("JOB_IDEMPOTENCY_CONFLICT",)),
    "JobInvalidError": ("JobError", ValueError, ("JOB_INVALID",)),
    "JobStateError": ("JobError", RuntimeError, ("JOB_STATE_INVALID",)),
    "LeaseLostError": ("JobError", RuntimeError, ("JOB_LEASE_LOST",)),
    "JobHandlerUnknownError": ("JobError", LookupError, ("JOB_HANDLER_UNKNOWN",)),
    "JobStoreError": ("JobError", RuntimeError, ("JOB_STORE_UNAVAILABLE", "JOB_STORE_SCHEMA")),
}


@pytest.mark.parametrize("name", sorted(TREE))
def test_error_places_and_codes(name: str) -> None:
    """Each class sits under its family and its builtin base, with exactly its codes."""
    parent, builtin, codes = TREE[name]
    cls = getattr(errors, name)
    assert issubclass(cls, getattr(errors, parent))
    assert issubclass(cls, errors.LifecycleError)
    if builtin is not None:
        assert issubclass(cls, builtin)
    assert cls.codes == codes
    for code in codes:
        error = cls(code)
        assert error.code == code
        assert str(error) == code


def test_foreign_code_refused() -> None:
    """A code belongs to one class: constructing with a foreign code is a programming error."""
    with pytest.raises(TypeError):
        errors.DrainNotFoundError("RUNTIME_STATE_NOT_FOUND")


def test_http_codes_by_prefix() -> None:
    """RUNTIME_STATE_SOURCE_HTTP_<status> is one family of codes carried by StateTransferFailedError."""
    assert errors.StateTransferFailedError("RUNTIME_STATE_SOURCE_HTTP_302").code.endswith("302")


@pytest.mark.parametrize("name", sorted(TREE))
def test_error_for_code_typed(name: str) -> None:
    """A client rebuilds the server's typed error from the wire code alone."""
    for code in TREE[name][2]:
        rebuilt = errors.error_for_code(code, "detail")
        assert type(rebuilt) is getattr(errors, name)
        assert (rebuilt.code, rebuilt.detail) == (code, "detail")


def test_unknown_code_is_remote() -> None:
    """A code from a newer server is kept verbatim rather than lost."""
    rebuilt = errors.error_for_code("RUNTIME_SOMETHING_NEW")
    assert isinstance(rebuilt, errors.RemoteError)
    assert rebuilt.code == "RUNTIME_SOMETHING_NEW"


def test_queue_error_codes() -> None:
    """Queue refusals say what happened and what to do, with their stable codes."""
    assert errors.QueueStoppedError().code == "QUEUE_STOPPED"
    assert "new generation" in str(errors.QueueIntakePausedError())
    stopped = errors.QueueKeyStoppedError("user-7")
    assert (stopped.code, stopped.key) == ("QUEUE_KEY_STOPPED", "user-7")
    assert errors.TaskCancelledError().code == "QUEUE_TASK_CANCELLED"


def test_public_errors_in_tree() -> None:
    """A new error class must be added here (and to the docstring's tree) on purpose."""
    families = {"LifecycleError", "DrainError", "StateError", "ControlError", "QueueError"}
    families |= {"ScheduleError", "JobError", "RemoteError", "MethodNotAllowedError"}
    queue = {"QueueStoppedError", "QueueIntakePausedError", "QueueKeyStoppedError"}
    queue |= {"TaskCancelledError"}
    classes = {name for name in errors.__all__ if name[0].isupper()}
    assert classes == set(TREE) | families | queue
