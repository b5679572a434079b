"""The seam between the drain and the work it must account for besides HTTP and WebSocket.

The keyed queue and the job worker report under ``jobs``, the scheduler under ``schedules``.
The Runtime calls every participant's :meth:`~WorkParticipant.pause_intake` in the same
synchronous step that closes the HTTP/WebSocket gate, so all intake stops at one instant.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

__all__ = ["ParticipantKind", "WorkParticipant"]

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

    async def drain(self, timeout: float) -> None:
        """Return once admitted work is done, within ``timeout`` seconds.

        A participant that can hand unfinished work back (durable jobs) releases it before the
        timeout and returns; one that cannot simply returns when idle and lets the caller's
        deadline decide.
        """
        ...

    def resume_intake(self) -> None:
        """Undo :meth:`pause_intake` (drain rollback)."""
        ...
