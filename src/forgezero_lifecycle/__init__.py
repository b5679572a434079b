"""forgezero-lifecycle: hand an ASGI service over to its next generation with nothing lost.

The root holds what an application uses: the :class:`Runtime`, the in-memory work it drains
(:class:`KeyedQueue`, :class:`Scheduler`, any :class:`WorkParticipant`), the state handoff's
:class:`StateAdapter` and :class:`StateImportContext`, and the errors an application catches.
Everything else has one public import path of its own::

    forgezero_lifecycle.jobs      durable fenced jobs: stores, worker, Lease
    forgezero_lifecycle.wire      the control protocol: wire models, paths, canonical JSON
    forgezero_lifecycle.errors    every other error class (one tree, drawn in its docstring)
    forgezero_lifecycle.client    the orchestrator's client of the control protocol
    forgezero_lifecycle.testing   clocks, an ASGI recorder, loop helpers for tests
    forgezero_lifecycle.metrics   the Prometheus collector (``[metrics]``)

Layers point down only (checked by import-linter in CI)::

    wire      pydantic models and constants of the control protocol; no I/O
    core      framework-neutral asyncio controllers: gate, drain and its steps, handoff, queue,
              scheduler, the signal hook that drains under a server the user runs
    jobs      durable fenced jobs: store protocol, SQLite, PostgreSQL, worker
    asgi      the only ASGI/Starlette speakers: in-flight middleware, control sub-app
    client    httpx client of the control protocol (orchestrator side)
    runtime   the composition root; serve and cli sit on top of it

Every name below is imported on first use (:mod:`forgezero_lifecycle._lazy`), so a process pays
only for what it touches: ``Runtime`` loads no pydantic (about 13 MiB resident with the wire
models) before the first drain request, and no httpx (about 5 MiB) unless it hands state over.
A name that moved off the root still resolves, with a :class:`DeprecationWarning` naming its
import path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import attach

#: Names the root exported before it kept only an application's: name -> its one import path.
_MOVED = {
    "Accepted": "forgezero_lifecycle.wire",
    "BodyTooLargeError": "forgezero_lifecycle.errors",
    "Clock": "forgezero_lifecycle.testing",
    "ContentTypeInvalidError": "forgezero_lifecycle.errors",
    "ControlApp": "forgezero_lifecycle.asgi.control",
    "ControlClient": "forgezero_lifecycle.client",
    "ControlError": "forgezero_lifecycle.errors",
    "ControlPathNotFoundError": "forgezero_lifecycle.errors",
    "ControlUnreachableError": "forgezero_lifecycle.errors",
    "DrainConflictError": "forgezero_lifecycle.errors",
    "DrainController": "forgezero_lifecycle.core.drain",
    "DrainCountersInvalidError": "forgezero_lifecycle.errors",
    "DrainDependencies": "forgezero_lifecycle.core.drain",
    "DrainError": "forgezero_lifecycle.errors",
    "DrainFailedError": "forgezero_lifecycle.errors",
    "DrainNotFoundError": "forgezero_lifecycle.errors",
    "DrainRequest": "forgezero_lifecycle.wire",
    "DrainRequestInvalidError": "forgezero_lifecycle.errors",
    "DrainStatistics": "forgezero_lifecycle.core.drain",
    "DrainStatus": "forgezero_lifecycle.wire",
    "GateStatistics": "forgezero_lifecycle.core.gate",
    "HandoffStatistics": "forgezero_lifecycle.core.handoff",
    "IdempotencyConflictError": "forgezero_lifecycle.errors",
    "InFlightMiddleware": "forgezero_lifecycle.asgi.middleware",
    "IntakeGate": "forgezero_lifecycle.core.gate",
    "Job": "forgezero_lifecycle.jobs",
    "JobError": "forgezero_lifecycle.errors",
    "JobHandlerUnknownError": "forgezero_lifecycle.errors",
    "JobInvalidError": "forgezero_lifecycle.errors",
    "JobState": "forgezero_lifecycle.jobs",
    "JobStateError": "forgezero_lifecycle.errors",
    "JobStatistics": "forgezero_lifecycle.jobs",
    "JobStore": "forgezero_lifecycle.jobs",
    "JobStoreError": "forgezero_lifecycle.errors",
    "JobWorker": "forgezero_lifecycle.jobs",
    "Lease": "forgezero_lifecycle.jobs",
    "MemoryJobStore": "forgezero_lifecycle.jobs",
    "MethodNotAllowedError": "forgezero_lifecycle.errors",
    "PostgresJobStore": "forgezero_lifecycle.jobs",
    "QueueDrainReport": "forgezero_lifecycle.core.queue",
    "QueueError": "forgezero_lifecycle.errors",
    "QueueKeyStoppedError": "forgezero_lifecycle.errors",
    "QueueParticipant": "forgezero_lifecycle.core.queue",
    "QueueStatistics": "forgezero_lifecycle.core.queue",
    "QueueStoppedError": "forgezero_lifecycle.errors",
    "RUNTIME_DRAIN_BEGIN_PATH": "forgezero_lifecycle.wire",
    "RUNTIME_DRAIN_CURRENT_PATH": "forgezero_lifecycle.wire",
    "RUNTIME_DRAIN_ROLLBACK_PATH": "forgezero_lifecycle.wire",
    "RUNTIME_DRAIN_STATUS_PATH": "forgezero_lifecycle.wire",
    "RUNTIME_LIVE_PATH": "forgezero_lifecycle.wire",
    "RUNTIME_METRICS_PATH": "forgezero_lifecycle.wire",
    "RUNTIME_OPENAPI_PATH": "forgezero_lifecycle.wire",
    "RUNTIME_READY_PATH": "forgezero_lifecycle.wire",
    "RUNTIME_SCHEDULES_STATUS_PATH": "forgezero_lifecycle.wire",
    "RUNTIME_STATE_BEGIN_PATH": "forgezero_lifecycle.wire",
    "RUNTIME_STATE_EXPORT_PATH": "forgezero_lifecycle.wire",
    "RUNTIME_STATE_STATUS_PATH": "forgezero_lifecycle.wire",
    "RemoteError": "forgezero_lifecycle.errors",
    "SQLiteJobStore": "forgezero_lifecycle.jobs",
    "ScheduleError": "forgezero_lifecycle.errors",
    "ScheduleIntakePausedError": "forgezero_lifecycle.errors",
    "ScheduleInvalidError": "forgezero_lifecycle.errors",
    "ScheduleNotFoundError": "forgezero_lifecycle.errors",
    "ScheduledJobStatistics": "forgezero_lifecycle.core.scheduler",
    "SchedulerParticipant": "forgezero_lifecycle.core.scheduler",
    "SchedulerStatistics": "forgezero_lifecycle.core.scheduler",
    "StateConflictError": "forgezero_lifecycle.errors",
    "StateEnvelope": "forgezero_lifecycle.wire",
    "StateError": "forgezero_lifecycle.errors",
    "StateExportError": "forgezero_lifecycle.errors",
    "StateHandoffController": "forgezero_lifecycle.core.handoff",
    "StateHandoffRequest": "forgezero_lifecycle.wire",
    "StateHandoffStatus": "forgezero_lifecycle.wire",
    "StateInputInvalidError": "forgezero_lifecycle.errors",
    "StateNotFoundError": "forgezero_lifecycle.errors",
    "StateSource": "forgezero_lifecycle.wire",
    "StateTransferFailedError": "forgezero_lifecycle.errors",
    "SyncControlClient": "forgezero_lifecycle.client",
    "SystemClock": "forgezero_lifecycle.testing",
    "TaskCancelledError": "forgezero_lifecycle.errors",
    "UnauthorizedError": "forgezero_lifecycle.errors",
    "WorkCounters": "forgezero_lifecycle.wire",
    "WorkerStatistics": "forgezero_lifecycle.jobs",
    "canonical_json": "forgezero_lifecycle.wire",
    "drain_request": "forgezero_lifecycle.client",
    "handoff_request": "forgezero_lifecycle.client",
    "new_nonce": "forgezero_lifecycle.client",
    "state_digest": "forgezero_lifecycle.wire",
}

if TYPE_CHECKING or not attach(__name__, moved=_MOVED):
    from ._errors import ConfigurationError as ConfigurationError
    from ._errors import ConnectionClosedByDrainError as ConnectionClosedByDrainError
    from ._errors import DrainingError as DrainingError
    from ._errors import LeaseLostError as LeaseLostError
    from ._errors import LifecycleError as LifecycleError
    from ._errors import QueueIntakePausedError as QueueIntakePausedError
    from ._version import __version__ as __version__
    from .core.handoff import StateAdapter as StateAdapter
    from .core.participant import WorkParticipant as WorkParticipant
    from .core.queue import KeyedQueue as KeyedQueue
    from .core.scheduler import Scheduler as Scheduler
    from .runtime import Runtime as Runtime
    from .wire.handoff import StateImportContext as StateImportContext
