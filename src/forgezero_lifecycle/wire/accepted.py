"""The answer of both ``begin`` endpoints, the drain's and the state handoff's (202)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from ._types import WIRE_CONFIG

__all__ = ["Accepted"]


class Accepted(BaseModel):
    """Begun: ``duplicate`` is true for an exact retry of the running drain or handoff."""

    model_config = WIRE_CONFIG

    accepted: Literal[True] = True
    duplicate: bool
