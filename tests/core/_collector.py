"""What the cyclic collector holds, for the tests of what a step leaves to it."""

from __future__ import annotations

import gc

__all__ = ["in_oldest_generation"]


def in_oldest_generation(value: object) -> bool:
    """Whether the collector holds ``value`` in its oldest generation."""
    return any(item is value for item in gc.get_objects(generation=2))
