"""The supervisor's answers (``forgezero-lifecycle serve --workers``): a reload and its handover.

``POST supervisor/v1/reload`` begins a handover to a new generation and answers
:class:`ReloadAccepted` with the handover's number; ``GET supervisor/v1/handover?handover=N``
answers :class:`HandoverStatus` until it is ``done`` (generation g+1 serves, g is drained and
gone) or ``aborted`` (g+1 could not start, could not take g's state or did not prove it serves,
and g serves on untouched; or the supervisor's stop ended it), with the
:data:`HandoverFailure` code of why. Without ``handover`` it answers the latest one. Both take
the control token.

``POST supervisor/v1/scale`` with :class:`ScaleRequest` (``{"by": 1}`` or ``{"by": -1}``, as
SIGTTIN and SIGTTOU) adds or removes one worker of the generation that serves and answers
:class:`ScaleAccepted`; ``GET supervisor/v1/status`` answers :class:`SupervisorStatus`: the
workers, the replacements made (recycled, unresponsive, added) and the unresponsive workers seen.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ._types import WIRE_CONFIG

__all__ = [
    "HandoverFailure",
    "HandoverState",
    "HandoverStatus",
    "ReloadAccepted",
    "ScaleAccepted",
    "ScaleRequest",
    "SupervisedWorker",
    "SupervisorStatus",
    "UnresponsiveWorker",
]

HandoverState = Literal["running", "done", "aborted"]
#: Why a handover was aborted, one stable code per cause: a worker of g+1 did not start (or the
#: revision could not be read); g+1 cannot take g's state; g+1 did not prove it serves within
#: ``--start-timeout``; the supervisor's stop ended it.
HandoverFailure = Literal[
    "RUNTIME_HANDOVER_START_FAILED",
    "RUNTIME_HANDOVER_STATE_REFUSED",
    "RUNTIME_HANDOVER_NOT_PROVED",
    "RUNTIME_HANDOVER_STOPPED",
]


class ReloadAccepted(BaseModel):
    """The answer to ``reload``: the handover begun, by its number (1 for the supervisor's first)."""

    model_config = WIRE_CONFIG

    accepted: Literal[True] = True
    handover: int


class HandoverStatus(BaseModel):
    """One handover of a supervisor, from generation ``from_generation`` to ``to_generation``."""

    model_config = WIRE_CONFIG

    handover: int
    state: HandoverState
    from_generation: int
    #: None until the new generation has been created.
    to_generation: int | None = None
    #: Why it was aborted, as a stable code (or ``None``).
    failure: HandoverFailure | None = None
    #: Why it was aborted, in words (or ``None``).
    detail: str | None = None
    #: How long it took, once it is no longer running.
    seconds: float | None = None


class ScaleRequest(BaseModel):
    """Add (``1``) or remove (``-1``) one worker of the generation that serves."""

    model_config = WIRE_CONFIG

    by: Literal[1, -1]


class ScaleAccepted(BaseModel):
    """The answer to ``scale``: the generation's size from now on (the worker added is ready
    and accepting once it started; the one removed hands its clients over and drains)."""

    model_config = WIRE_CONFIG

    accepted: Literal[True] = True
    workers: int


class SupervisedWorker(BaseModel):
    """One live worker process of the supervisor."""

    model_config = WIRE_CONFIG

    generation: int
    worker: int
    pid: int | None = None
    #: ``starting``, ``ready``, ``accepting`` or ``stopping``.
    state: str
    #: It left its generation alone: recycled, scaled down or unresponsive.
    retired: bool = False


class UnresponsiveWorker(BaseModel):
    """A worker whose event loop did not answer the heartbeat within ``--worker-timeout``."""

    model_config = WIRE_CONFIG

    generation: int
    worker: int
    pid: int | None = None
    #: What it held when it last answered (requests, WebSockets, jobs, schedules in flight).
    in_flight: dict[str, int] = Field(default_factory=dict)
    detail: str


class SupervisorStatus(BaseModel):
    """The supervisor: its phase, its workers, the replacements made and unresponsive workers."""

    model_config = WIRE_CONFIG

    #: ``starting``, ``serving``, ``handing-over``, ``stopping`` or ``stopped``.
    phase: str
    #: The generation that serves.
    generation: int | None = None
    #: The workers a generation is to have (``--workers``, changed by scaling).
    size: int
    workers: list[SupervisedWorker]
    #: Replacements done since the start, by kind: ``recycle``, ``unresponsive``, ``scale-up``.
    replaced: dict[str, int] = Field(default_factory=dict)
    #: Replacements given up (the new worker did not start, or a handover came first).
    given_up: int = 0
    #: The replacement running, in words (None: none).
    replacing: str | None = None
    #: The most recent unresponsive workers, newest last.
    unresponsive: list[UnresponsiveWorker] = Field(default_factory=list)
