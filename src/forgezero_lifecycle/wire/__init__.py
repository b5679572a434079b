"""The control protocol (layer 0): its wire models, its paths and its canonical JSON; no I/O.

Byte-compatible with the JavaScript `@forgezero/runtime` lifecycle module. The models are
pydantic; every name is imported on first use (:mod:`forgezero_lifecycle._lazy`), so reading a
path constant loads no pydantic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import attach

if TYPE_CHECKING or not attach(__name__):
    from .._canonical import canonical_json as canonical_json
    from .._canonical import state_digest as state_digest
    from .accepted import Accepted as Accepted
    from .drain import DrainRequest as DrainRequest
    from .drain import DrainStatus as DrainStatus
    from .drain import WorkCounters as WorkCounters
    from .handoff import StateEnvelope as StateEnvelope
    from .handoff import StateHandoffRequest as StateHandoffRequest
    from .handoff import StateHandoffStatus as StateHandoffStatus
    from .handoff import StateSource as StateSource
    from .paths import RUNTIME_DRAIN_BEGIN_PATH as RUNTIME_DRAIN_BEGIN_PATH
    from .paths import RUNTIME_DRAIN_CURRENT_PATH as RUNTIME_DRAIN_CURRENT_PATH
    from .paths import RUNTIME_DRAIN_ROLLBACK_PATH as RUNTIME_DRAIN_ROLLBACK_PATH
    from .paths import RUNTIME_DRAIN_STATUS_PATH as RUNTIME_DRAIN_STATUS_PATH
    from .paths import RUNTIME_LIVE_PATH as RUNTIME_LIVE_PATH
    from .paths import RUNTIME_METRICS_PATH as RUNTIME_METRICS_PATH
    from .paths import RUNTIME_OPENAPI_PATH as RUNTIME_OPENAPI_PATH
    from .paths import RUNTIME_READY_PATH as RUNTIME_READY_PATH
    from .paths import RUNTIME_SCHEDULES_STATUS_PATH as RUNTIME_SCHEDULES_STATUS_PATH
    from .paths import RUNTIME_STATE_BEGIN_PATH as RUNTIME_STATE_BEGIN_PATH
    from .paths import RUNTIME_STATE_EXPORT_PATH as RUNTIME_STATE_EXPORT_PATH
    from .paths import RUNTIME_STATE_STATUS_PATH as RUNTIME_STATE_STATUS_PATH
