"""The seam between the drain and the work it must account for besides HTTP and WebSocket.

The keyed queue and the job worker report under ``jobs``, the scheduler under ``schedules``.
The drain's steps (:mod:`forgezero_lifecycle.core.steps`) call every participant's
:meth:`~WorkParticipant.pause_intake` in the same synchronous step that closes the HTTP/WebSocket
gate, so all intake stops at one instant, then :meth:`~WorkParticipant.finish` on all of them.

``finish`` was called ``drain`` until the word named five things; a participant written against
that name is taken, with a :class:`DeprecationWarning` (:func:`as_participant`).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal, Protocol, final, runtime_checkable

__all__ = ["ParticipantKind", "WorkParticipant", "as_participant"]

ParticipantKind = Literal["jobs", "schedules"]


@runtime_checkable
class WorkParticipant(Protocol):
    """Memory or durable work that a drain closes, waits for and can reopen."""

    @property
    def kind(self) -> ParticipantKind:
        """The drain status counter this participant adds to."""
        ...

    def in_flight(self) -> int:
        """Admitted units not yet finished (running plus accepted-and-waiting)."""
        ...

    def pause_intake(self) -> None:
        """Refuse new work from now on; admitted work continues. Synchronous, never blocks."""
        ...

    async def finish(self, timeout: float) -> None:
        """Return once admitted work is done, within ``timeout`` seconds.

        A participant that can hand unfinished work back (durable jobs) releases it before the
        timeout and returns; one that cannot simply returns when idle and lets the caller's
        deadline decide.
        """
        ...

    def resume_intake(self) -> None:
        """Undo :meth:`pause_intake` (drain rollback)."""
        ...


def as_participant(candidate: object) -> WorkParticipant | None:
    """``candidate`` as a participant; one with ``drain`` instead of ``finish`` is adapted, with a
    :class:`DeprecationWarning`; None when it is neither."""
    if isinstance(candidate, WorkParticipant):
        return candidate
    if all(callable(getattr(candidate, name, None)) for name in _LEGACY) and hasattr(
        candidate, "kind"
    ):
        warnings.warn(
            f"{type(candidate).__name__}.drain(timeout): a WorkParticipant now names this "
            "method finish(timeout); rename it",
            DeprecationWarning,
            stacklevel=3,
        )
        return _Renamed(candidate)
    return None


_LEGACY = ("in_flight", "pause_intake", "drain", "resume_intake")


@final
class _Renamed:
    """A participant written against ``drain(timeout)``, seen through ``finish(timeout)``."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @property
    def kind(self) -> ParticipantKind:
        kind: ParticipantKind = self._inner.kind
        return kind

    def in_flight(self) -> int:
        count: int = self._inner.in_flight()
        return count

    def pause_intake(self) -> None:
        self._inner.pause_intake()

    async def finish(self, timeout: float) -> None:
        await self._inner.drain(timeout)

    def resume_intake(self) -> None:
        self._inner.resume_intake()
