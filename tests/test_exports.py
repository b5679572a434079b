"""The package root re-exports the public API, and nothing else, in a sorted __all__."""

from __future__ import annotations

import inspect
import os

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
    """Each name in __all__ is importable from the root (the client and PostgreSQL lazily)."""
    for name in forgezero_lifecycle.__all__:
        assert getattr(forgezero_lifecycle, name) is not None, name


def test_public_names_are_exactly_all() -> None:
    """No public name sits on the root without being in __all__ (httpx's rule)."""
    public = {
        name
        for name, value in vars(forgezero_lifecycle).items()
        if not name.startswith("_") and not isinstance(value, type(forgezero_lifecycle))
    }
    public -= {"annotations", "TYPE_CHECKING", "Any", "importlib"}
    lazy = set(forgezero_lifecycle._LAZY)
    assert public - lazy == set(forgezero_lifecycle.__all__) - lazy
    assert lazy <= set(forgezero_lifecycle.__all__)
    assert lazy <= set(dir(forgezero_lifecycle))


def test_exported_objects_claim_a_library_module() -> None:
    """Classes and functions exported from the root are defined inside the library."""
    for name in forgezero_lifecycle.__all__:
        value = getattr(forgezero_lifecycle, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__.startswith("forgezero_lifecycle"), name


def test_importing_the_runtime_does_not_import_httpx() -> None:
    """A served generation without a state adapter never pays for httpx (about 5 MiB)."""
    import subprocess
    import sys

    probe = (
        "import sys, forgezero_lifecycle as f; f.Runtime(control_token='t' * 32); "
        "print('httpx' in sys.modules)"
    )
    # Unmeasured: coverage keeps its data in SQLite, so a measured child has sqlite3 loaded.
    env = {k: v for k, v in os.environ.items() if k != "COVERAGE_PROCESS_CONFIG"}
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()
    assert loaded == "False"


def test_importing_the_runtime_loads_no_sql_store_and_no_cron_parser() -> None:
    """sqlite3 (about 1 MiB) and cronsim load only when a SQLite store or a cron job is made."""
    import subprocess
    import sys

    probe = (
        "import sys, forgezero_lifecycle as f; f.Runtime(control_token='t' * 32); "
        "print(sorted(m for m in ('sqlite3', 'cronsim', 'psycopg') if m in sys.modules))"
    )
    # Unmeasured: coverage keeps its data in SQLite, so a measured child has sqlite3 loaded.
    env = {k: v for k, v in os.environ.items() if k != "COVERAGE_PROCESS_CONFIG"}
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()
    assert loaded == "[]"
