"""What the cyclic collector holds, for the tests of the handoff's collector setting.

These tests must touch the process's collector: the setting they check
(``Runtime(handoff_pauses_collector=...)``, ``StateCodec.pause_collector``) is about what it
scans. They read only what ``gc`` documents on every CPython 3.11+: whether it is enabled, the
freeze count, and which objects ``gc.get_objects(generation=0)`` lists, the young generation
the next young collection scans. Where an object handed past it lands differs between versions
(``get_objects`` lists it in the oldest generation on 3.11 and 3.13, in the middle one on
3.12), so no test names that generation.

The codec hands a value past the young generation only while nothing is frozen
(``gc.get_freeze_count() == 0``); otherwise it leaves the value to the collector. CPython 3.12
starts with some of its own objects frozen (375 tuples in 3.12.1), 3.11 and 3.13 with none: the
tests of what a paused step hands on first unfreeze what is frozen (:func:`nothing_frozen`),
which moves those tuples to the oldest generation for the rest of the session, as any test that
freezes and unfreezes does; what happens with objects frozen is tested by freezing some.
"""

from __future__ import annotations

import gc

__all__ = ["in_young_generation", "nothing_frozen"]


def in_young_generation(value: object) -> bool:
    """Whether ``value`` is among the objects the next young collection scans."""
    return any(item is value for item in gc.get_objects(generation=0))


def nothing_frozen() -> None:
    """Unfreeze whatever is frozen, so that a paused step hands what outlives it on."""
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
