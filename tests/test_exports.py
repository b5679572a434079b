"""The package root re-exports the public API, and nothing else, in a sorted __all__."""

from __future__ import annotations

import inspect

import forgezero_lifecycle


def _isort_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions.
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def test_all_is_sorted_and_unique() -> None:
    """__all__ is kept sorted so additions are reviewed where they belong."""
    names = forgezero_lifecycle.__all__
    assert names == sorted(names, key=_isort_key)
    assert len(names) == len(set(names))


def test_every_exported_name_resolves() -> None:
    """Each name in __all__ is importable from the root (PostgresJobStore lazily)."""
    for name in forgezero_lifecycle.__all__:
        assert getattr(forgezero_lifecycle, name) is not None, name


def test_public_names_are_exactly_all() -> None:
    """No public name sits on the root without being in __all__ (httpx's rule)."""
    public = {
        name
        for name, value in vars(forgezero_lifecycle).items()
        if not name.startswith("_") and not isinstance(value, type(forgezero_lifecycle))
    }
    public -= {"annotations", "TYPE_CHECKING", "Any"}
    assert public == set(forgezero_lifecycle.__all__) - {"PostgresJobStore"}


def test_exported_objects_claim_a_library_module() -> None:
    """Classes and functions exported from the root are defined inside the library."""
    for name in forgezero_lifecycle.__all__:
        value = getattr(forgezero_lifecycle, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__.startswith("forgezero_lifecycle"), name
