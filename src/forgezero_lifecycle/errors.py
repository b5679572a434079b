"""The library's error classes an application rarely catches, each with its stable ``code``.

The whole tree is drawn in :mod:`forgezero_lifecycle._errors`'s docstring. Its root
:class:`~forgezero_lifecycle.LifecycleError` and the errors an application catches
(``ConfigurationError``, ``ConnectionClosedByDrainError``, ``DrainingError``, ``LeaseLostError``,
``QueueIntakePausedError``) are imported from the package root; every other class from here.
"""

from __future__ import annotations

from ._errors import BodyTimeoutError as BodyTimeoutError
from ._errors import BodyTooLargeError as BodyTooLargeError
from ._errors import ContentTypeInvalidError as ContentTypeInvalidError
from ._errors import ControlError as ControlError
from ._errors import ControlPathNotFoundError as ControlPathNotFoundError
from ._errors import ControlUnreachableError as ControlUnreachableError
from ._errors import DrainConflictError as DrainConflictError
from ._errors import DrainCountersInvalidError as DrainCountersInvalidError
from ._errors import DrainError as DrainError
from ._errors import DrainFailedError as DrainFailedError
from ._errors import DrainNotFoundError as DrainNotFoundError
from ._errors import DrainRequestInvalidError as DrainRequestInvalidError
from ._errors import IdempotencyConflictError as IdempotencyConflictError
from ._errors import JobError as JobError
from ._errors import JobHandlerUnknownError as JobHandlerUnknownError
from ._errors import JobInvalidError as JobInvalidError
from ._errors import JobStateError as JobStateError
from ._errors import JobStoreError as JobStoreError
from ._errors import MethodNotAllowedError as MethodNotAllowedError
from ._errors import QueueError as QueueError
from ._errors import QueueKeyStoppedError as QueueKeyStoppedError
from ._errors import QueueStoppedError as QueueStoppedError
from ._errors import ReloadBusyError as ReloadBusyError
from ._errors import RemoteError as RemoteError
from ._errors import ScaleRefusedError as ScaleRefusedError
from ._errors import ScheduleError as ScheduleError
from ._errors import ScheduleIntakePausedError as ScheduleIntakePausedError
from ._errors import ScheduleInvalidError as ScheduleInvalidError
from ._errors import ScheduleNotFoundError as ScheduleNotFoundError
from ._errors import StateConflictError as StateConflictError
from ._errors import StateError as StateError
from ._errors import StateExportError as StateExportError
from ._errors import StateInputInvalidError as StateInputInvalidError
from ._errors import StateNotFoundError as StateNotFoundError
from ._errors import StateTransferFailedError as StateTransferFailedError
from ._errors import TaskCancelledError as TaskCancelledError
from ._errors import UnauthorizedError as UnauthorizedError

__all__ = [
    "BodyTimeoutError",
    "BodyTooLargeError",
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
    "IdempotencyConflictError",
    "JobError",
    "JobHandlerUnknownError",
    "JobInvalidError",
    "JobStateError",
    "JobStoreError",
    "MethodNotAllowedError",
    "QueueError",
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
]
