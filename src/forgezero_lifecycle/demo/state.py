"""The demo app's handoff state: a visit counter, exported by the old generation, merged by the new.

Only this typed, versioned, non-secret value crosses generations (never memory or sockets).
"""

from __future__ import annotations

from typing import Final, final

from pydantic import BaseModel

from ..wire.handoff import StateImportContext

__all__ = ["STATE_PROTOCOL", "STATE_SCHEMA_VERSION", "DemoState", "Visits"]

STATE_PROTOCOL: Final = "demo.visits"
STATE_SCHEMA_VERSION: Final = 1


class Visits(BaseModel):
    """The handoff value: visits served so far, by generation label."""

    visits: int
    by: dict[str, int]


@final
class DemoState:
    """The app's state and its :class:`~forgezero_lifecycle.core.handoff.StateAdapter`."""

    protocol = STATE_PROTOCOL
    schema_version = STATE_SCHEMA_VERSION
    maximum_bytes = 4096
    model = Visits

    def __init__(self, generation: str) -> None:
        self.generation = generation
        self.by: dict[str, int] = {generation: 0}
        self.imported_from: str | None = None

    def visit(self) -> int:
        self.by[self.generation] += 1
        return sum(self.by.values())

    async def export_state(self) -> tuple[str, Visits]:
        total = sum(self.by.values())
        return f"visits-{total}", Visits(visits=total, by=dict(self.by))

    async def import_state(self, value: Visits, context: StateImportContext) -> None:
        for label, count in value.by.items():
            if label != self.generation:
                self.by[label] = self.by.get(label, 0) + count
        self.imported_from = context.source_revision
