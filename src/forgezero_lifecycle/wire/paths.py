"""The control plane's paths: the original's strings, and the port's additions beside them.

The original is the JavaScript `@forgezero/runtime` lifecycle module."""

from __future__ import annotations

from typing import Final

__all__ = [
    "CONTROL_PREFIX",
    "IMPORTER_CHECKS",
    "IMPORT_CHECK_QUERY",
    "RUNTIME_DRAIN_BEGIN_PATH",
    "RUNTIME_DRAIN_CURRENT_PATH",
    "RUNTIME_DRAIN_ROLLBACK_PATH",
    "RUNTIME_DRAIN_STATUS_PATH",
    "RUNTIME_LIVE_PATH",
    "RUNTIME_METRICS_PATH",
    "RUNTIME_OPENAPI_PATH",
    "RUNTIME_READY_PATH",
    "RUNTIME_SCHEDULES_STATUS_PATH",
    "RUNTIME_STATE_BEGIN_PATH",
    "RUNTIME_STATE_EXPORT_PATH",
    "RUNTIME_STATE_STATUS_PATH",
    "RUNTIME_SUPERVISOR_HANDOVER_PATH",
    "RUNTIME_SUPERVISOR_RELOAD_PATH",
    "RUNTIME_SUPERVISOR_SCALE_PATH",
    "RUNTIME_SUPERVISOR_STATUS_PATH",
]

#: Every control path starts here; the middleware neither counts nor refuses these.
CONTROL_PREFIX: Final = "/.forgezero/runtime/"

RUNTIME_DRAIN_BEGIN_PATH: Final = "/.forgezero/runtime/drain/v1/begin"
RUNTIME_DRAIN_STATUS_PATH: Final = "/.forgezero/runtime/drain/v1/status"
RUNTIME_DRAIN_ROLLBACK_PATH: Final = "/.forgezero/runtime/drain/v1/rollback"
#: The port's addition: the running drain's status without its nonce (an operator who lost it).
RUNTIME_DRAIN_CURRENT_PATH: Final = "/.forgezero/runtime/drain/v1/current"
RUNTIME_STATE_EXPORT_PATH: Final = "/.forgezero/runtime/state/v1/export"
#: The port's addition to the export's query: ``importCheck=importer`` in the URL an orchestrator
#: gives a new generation to fetch says that its importer validates the value against its model
#: itself (every import does), so the export makes no import check of its own: the value is
#: validated once, not twice. An export asked for without it (a backup, an operator's look) is
#: checked as before; the JavaScript original ignores the parameter.
IMPORT_CHECK_QUERY: Final = "importCheck"
IMPORTER_CHECKS: Final = "importer"
RUNTIME_STATE_BEGIN_PATH: Final = "/.forgezero/runtime/state/v1/begin"
RUNTIME_STATE_STATUS_PATH: Final = "/.forgezero/runtime/state/v1/status"
RUNTIME_SCHEDULES_STATUS_PATH: Final = "/.forgezero/runtime/schedules/v1/status"
RUNTIME_READY_PATH: Final = "/.forgezero/runtime/ready"
RUNTIME_LIVE_PATH: Final = "/.forgezero/runtime/live"
#: The port's addition, served only when enabled (``Runtime(openapi=True)``).
RUNTIME_OPENAPI_PATH: Final = "/.forgezero/runtime/openapi.json"
#: The port's addition, served only when enabled (``Runtime(metrics=registry)``).
RUNTIME_METRICS_PATH: Final = "/.forgezero/runtime/metrics"
#: Only under ``forgezero-lifecycle serve --workers``: begin a handover to a new generation.
RUNTIME_SUPERVISOR_RELOAD_PATH: Final = "/.forgezero/runtime/supervisor/v1/reload"
#: Only under ``forgezero-lifecycle serve --workers``: how a handover begun by reload went.
RUNTIME_SUPERVISOR_HANDOVER_PATH: Final = "/.forgezero/runtime/supervisor/v1/handover"
#: Only under ``forgezero-lifecycle serve --workers``: add or remove one worker.
RUNTIME_SUPERVISOR_SCALE_PATH: Final = "/.forgezero/runtime/supervisor/v1/scale"
#: Only under ``forgezero-lifecycle serve --workers``: its workers, replacements and counts.
RUNTIME_SUPERVISOR_STATUS_PATH: Final = "/.forgezero/runtime/supervisor/v1/status"
