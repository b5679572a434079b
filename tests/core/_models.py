"""Typed state values the handoff tests share: one whose JSON its own model refuses, and one
that counts how often it is validated."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, field_serializer, model_validator

__all__ = ["Checked", "Counter"]


class Counter(BaseModel):
    count: int

    @field_serializer("count")
    def _as_text(self, count: int) -> str:
        return str(count)  # serialises as "7": strict JSON validation would refuse it


class Checked(BaseModel):
    """A model that counts how often its JSON is validated (class-wide, reset by each test)."""

    count: int
    validations: ClassVar[list[int]] = []

    @model_validator(mode="after")
    def _counted(self) -> Checked:
        Checked.validations.append(self.count)
        return self
