"""The supervisor's record of its handovers, which ``supervisor/v1/handover`` answers from.

Each reload (SIGHUP or ``POST supervisor/v1/reload``) begins one :class:`Handover`, numbered from
1; it is ``running`` until generation g+1 serves and g is gone (``done``), or until g+1 could not
start or could not take g's state and g serves on (``aborted``, with the reason). The most recent
:data:`RECENT` are kept, so ``forgezero-lifecycle reload`` can wait for the one it began even if
another reload follows.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final, final

from ..wire.supervisor import HandoverState, HandoverStatus

__all__ = ["RECENT", "Handover", "HandoverLog"]

#: Handovers kept for ``supervisor/v1/handover``.
RECENT: Final = 16


@final
@dataclass
class Handover:
    """One handover, from generation ``from_generation``."""

    number: int
    from_generation: int
    to_generation: int | None = None
    state: HandoverState = "running"
    detail: str | None = None
    seconds: float | None = None
    _began: float = field(default_factory=time.monotonic, repr=False)

    def end(self, state: HandoverState, detail: str | None = None) -> None:
        self.state = state
        self.detail = detail
        self.seconds = round(time.monotonic() - self._began, 3)

    def wire(self) -> dict[str, Any]:
        """The ``supervisor/v1/handover`` answer, a :class:`HandoverStatus`."""
        return HandoverStatus(
            handover=self.number,
            state=self.state,
            from_generation=self.from_generation,
            to_generation=self.to_generation,
            detail=self.detail,
            seconds=self.seconds,
        ).model_dump(mode="json")


@final
class HandoverLog:
    """The supervisor's recent handovers, newest last."""

    def __init__(self) -> None:
        self._recent: deque[Handover] = deque(maxlen=RECENT)
        self._begun = 0

    def begin(self, from_generation: int) -> Handover:
        self._begun += 1
        handover = Handover(self._begun, from_generation)
        self._recent.append(handover)
        return handover

    def find(self, number: int | None = None) -> Handover | None:
        """Handover ``number``, or the latest when it is None; None when not (or no longer) kept."""
        if number is None:
            return self._recent[-1] if self._recent else None
        return next((h for h in self._recent if h.number == number), None)
