"""forgezero-lifecycle: hand an ASGI service over to its next generation with nothing lost.

Layers point down only (checked by import-linter in CI)::

    wire      pydantic models and constants of the control protocol; no I/O
    core      framework-neutral asyncio controllers: gate, drain, handoff, queue, scheduler,
              the signal hook that drains under a server the user runs
    jobs      durable fenced jobs: store protocol, SQLite, PostgreSQL, worker
    asgi      the only ASGI/Starlette speakers: in-flight middleware, control sub-app
    client    httpx client of the control protocol (orchestrator side)
    runtime   the composition root; serve and cli sit on top of it

Every name below is imported on first use (:mod:`forgezero_lifecycle._lazy`), so a process pays
only for what it touches: ``Runtime`` loads no pydantic (about 13 MiB resident with the wire
models) before the first drain request, no httpx (about 5 MiB) unless it hands state over or uses
the orchestrator client (``ControlClient`` and friends), no :mod:`sqlite3` without a
``SQLiteJobStore`` and no psycopg without a ``PostgresJobStore`` (so the package works without
psycopg installed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import attach

if TYPE_CHECKING:
    from ._canonical import canonical_json as canonical_json
    from ._canonical import state_digest as state_digest
    from ._clock import Clock as Clock
    from ._clock import SystemClock as SystemClock
    from ._errors import BodyTooLargeError as BodyTooLargeError
    from ._errors import ConfigurationError as ConfigurationError
    from ._errors import ConnectionClosedByDrainError as ConnectionClosedByDrainError
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
    from ._errors import LeaseLostError as LeaseLostError
    from ._errors import LifecycleError as LifecycleError
    from ._errors import MethodNotAllowedError as MethodNotAllowedError
    from ._errors import QueueError as QueueError
    from ._errors import QueueIntakePausedError as QueueIntakePausedError
    from ._errors import QueueKeyStoppedError as QueueKeyStoppedError
    from ._errors import QueueStoppedError as QueueStoppedError
    from ._errors import RemoteError as RemoteError
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
    from ._version import __version__ as __version__
    from .asgi.control import ControlApp as ControlApp
    from .asgi.middleware import InFlightMiddleware as InFlightMiddleware
    from .client import ControlClient as ControlClient
    from .client import SyncControlClient as SyncControlClient
    from .client import drain_request as drain_request
    from .client import handoff_request as handoff_request
    from .client import new_nonce as new_nonce
    from .core.drain import DrainController as DrainController
    from .core.drain import DrainDependencies as DrainDependencies
    from .core.drain import DrainStatistics as DrainStatistics
    from .core.gate import GateStatistics as GateStatistics
    from .core.gate import IntakeGate as IntakeGate
    from .core.handoff import HandoffStatistics as HandoffStatistics
    from .core.handoff import StateAdapter as StateAdapter
    from .core.handoff import StateHandoffController as StateHandoffController
    from .core.participant import WorkParticipant as WorkParticipant
    from .core.queue import KeyedQueue as KeyedQueue
    from .core.queue import QueueDrainReport as QueueDrainReport
    from .core.queue import QueueParticipant as QueueParticipant
    from .core.queue import QueueStatistics as QueueStatistics
    from .core.scheduler import ScheduledJobStatistics as ScheduledJobStatistics
    from .core.scheduler import Scheduler as Scheduler
    from .core.scheduler import SchedulerParticipant as SchedulerParticipant
    from .core.scheduler import SchedulerStatistics as SchedulerStatistics
    from .jobs import Job as Job
    from .jobs import JobState as JobState
    from .jobs import JobStatistics as JobStatistics
    from .jobs import JobStore as JobStore
    from .jobs import JobWorker as JobWorker
    from .jobs import Lease as Lease
    from .jobs import MemoryJobStore as MemoryJobStore
    from .jobs import WorkerStatistics as WorkerStatistics
    from .jobs.postgres import PostgresJobStore as PostgresJobStore
    from .jobs.sqlite import SQLiteJobStore as SQLiteJobStore
    from .runtime import Runtime as Runtime
    from .wire.accepted import Accepted as Accepted
    from .wire.drain import DrainRequest as DrainRequest
    from .wire.drain import DrainStatus as DrainStatus
    from .wire.drain import WorkCounters as WorkCounters
    from .wire.handoff import StateEnvelope as StateEnvelope
    from .wire.handoff import StateHandoffRequest as StateHandoffRequest
    from .wire.handoff import StateHandoffStatus as StateHandoffStatus
    from .wire.handoff import StateImportContext as StateImportContext
    from .wire.handoff import StateSource as StateSource
    from .wire.paths import RUNTIME_DRAIN_BEGIN_PATH as RUNTIME_DRAIN_BEGIN_PATH
    from .wire.paths import RUNTIME_DRAIN_CURRENT_PATH as RUNTIME_DRAIN_CURRENT_PATH
    from .wire.paths import RUNTIME_DRAIN_ROLLBACK_PATH as RUNTIME_DRAIN_ROLLBACK_PATH
    from .wire.paths import RUNTIME_DRAIN_STATUS_PATH as RUNTIME_DRAIN_STATUS_PATH
    from .wire.paths import RUNTIME_LIVE_PATH as RUNTIME_LIVE_PATH
    from .wire.paths import RUNTIME_METRICS_PATH as RUNTIME_METRICS_PATH
    from .wire.paths import RUNTIME_OPENAPI_PATH as RUNTIME_OPENAPI_PATH
    from .wire.paths import RUNTIME_READY_PATH as RUNTIME_READY_PATH
    from .wire.paths import RUNTIME_SCHEDULES_STATUS_PATH as RUNTIME_SCHEDULES_STATUS_PATH
    from .wire.paths import RUNTIME_STATE_BEGIN_PATH as RUNTIME_STATE_BEGIN_PATH
    from .wire.paths import RUNTIME_STATE_EXPORT_PATH as RUNTIME_STATE_EXPORT_PATH
    from .wire.paths import RUNTIME_STATE_STATUS_PATH as RUNTIME_STATE_STATUS_PATH

__getattr__, __dir__, __all__ = attach(__name__)
