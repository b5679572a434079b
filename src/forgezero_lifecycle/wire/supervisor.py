"""The supervisor's answers (``forgezero-lifecycle serve --workers``): a reload and its handover.

``POST supervisor/v1/reload`` begins a handover to a new generation and answers
:class:`ReloadAccepted` with the handover's number; ``GET supervisor/v1/handover?handover=N``
answers :class:`HandoverStatus` until it is ``done`` (generation g+1 serves, g is drained and
gone) or ``aborted`` (g+1 could not start or could not take g's state; g serves on untouched).
Without ``handover`` it answers the latest one. Both take the control token.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from ._types import WIRE_CONFIG

__all__ = ["HandoverState", "HandoverStatus", "ReloadAccepted"]

HandoverState = Literal["running", "done", "aborted"]


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
    #: Why it was aborted (or ``None``).
    detail: str | None = None
    #: How long it took, once it is no longer running.
    seconds: float | None = None
