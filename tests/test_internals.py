"""Another library's private attribute is touched only by the one module that lists it
(``forgezero_lifecycle/_internals/``), and what each lists is there in the installed version."""

from __future__ import annotations

import ast
import importlib
import logging
from pathlib import Path
from typing import Final

import pytest

import forgezero_lifecycle
from forgezero_lifecycle import _internals

_SOURCE: Final = Path(forgezero_lifecycle.__file__).parent
_INTERNALS: Final = _SOURCE / "_internals"
_RECEIVERS_OWN: Final = frozenset({"self", "cls"})
_ATTRIBUTE_CALLS: Final = frozenset({"getattr", "hasattr", "setattr", "delattr"})
#: Another library's modules: imported from outside _internals/ only at their top level.
_FOREIGN: Final = frozenset({"uvicorn", "hypercorn", "gunicorn", "uvicorn_worker", "h11", "h2"})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _trees() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text()) for path in sorted(_SOURCE.rglob("*.py"))}


def _own_names(trees: dict[Path, ast.Module]) -> set[str]:
    """The private names the library defines itself: its functions, classes, parameters,
    module and class attributes, ``__slots__`` and what it sets on ``self`` or ``cls``."""
    own: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(node.name)
            if isinstance(node, ast.arg):
                own.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in _RECEIVERS_OWN
            ):
                own.add(node.attr)
            elif isinstance(node, ast.alias):
                own.add((node.asname or node.name).rpartition(".")[2])
            elif isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "__slots__" for target in node.targets
            ):
                own |= {
                    constant.value
                    for constant in ast.walk(node.value)
                    if isinstance(constant, ast.Constant) and isinstance(constant.value, str)
                }
    return {name for name in own if _private(name)}


def _private_accesses(tree: ast.Module) -> list[tuple[int, str, str]]:
    """``(line, receiver, name)`` of every private attribute read or set on an object other
    than ``self``/``cls``, through a dot, ``getattr``/``hasattr``/``setattr`` or a keyword."""
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            receiver = ast.unparse(node.value)
            if receiver not in _RECEIVERS_OWN:
                found.append((node.lineno, receiver, node.attr))
        elif isinstance(node, ast.Call):
            if (
                isinstance(node.func, ast.Name)
                and node.func.id in _ATTRIBUTE_CALLS
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and _private(node.args[1].value)
            ):
                found.append((node.lineno, ast.unparse(node.args[0]), node.args[1].value))
            found += [
                (node.lineno, f"{ast.unparse(node.func)}(...)", keyword.arg)
                for keyword in node.keywords
                if keyword.arg is not None and _private(keyword.arg)
            ]
    return found


def _listed() -> dict[str, frozenset[str]]:
    """Each library module's list of the private names it uses."""
    return {
        name: importlib.import_module(f"forgezero_lifecycle._internals.{name}").PRIVATE
        for name in _internals.LIBRARIES
    }


def test_foreign_private_attributes_only_in_their_library_module() -> None:
    """Outside ``_internals/``, a private name on another object is one the library defines
    itself, and never one a library module lists (those are read there, through a function)."""
    trees = _trees()
    own = _own_names(trees)
    listed = frozenset().union(*_listed().values())
    offending = [
        f"{path.relative_to(_SOURCE)}:{line}: {receiver}.{name}"
        for path, tree in trees.items()
        if _INTERNALS not in path.parents
        for line, receiver, name in _private_accesses(tree)
        if name in listed or name not in own
    ]
    assert offending == [], (
        "another library's private attribute, used outside forgezero_lifecycle/_internals/: "
        "read it in that library's module there (listed in its PRIVATE, checked by missing())"
    )


def test_library_modules_use_only_what_they_list() -> None:
    """Each library module's private names on other objects are in its ``PRIVATE`` list, and
    every name listed is used (the list is neither short nor stale)."""
    for name, listed in _listed().items():
        path = _INTERNALS / f"{name}.py"
        tree = ast.parse(path.read_text())
        used = {found for _, _, found in _private_accesses(tree)}
        assert used <= listed, f"{name}: used but not listed: {sorted(used - listed)}"
        assert listed <= used, f"{name}: listed but not used: {sorted(listed - used)}"


def test_foreign_submodules_imported_only_in_library_modules() -> None:
    """Outside ``_internals/``, another library is imported at its top level only (its
    ``uvicorn.Server``, ``uvicorn_worker.UvicornWorker``): what its submodules hold is not its
    documented API."""
    offending = []
    for path, tree in _trees().items():
        if _INTERNALS in path.parents:
            continue
        for node in ast.walk(tree):
            modules: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            offending += [
                f"{path.relative_to(_SOURCE)}:{node.lineno}: {module}"
                for module in modules
                if "." in module and module.partition(".")[0] in _FOREIGN
            ]
    assert offending == []


@pytest.mark.parametrize("library", _internals.LIBRARIES)
def test_installed_versions_have_what_is_listed(library: str) -> None:
    """The installed uvicorn, hypercorn, gunicorn (with uvicorn-worker) and asyncio lack
    nothing: every real-server test runs the paths that rely on them."""
    module = importlib.import_module(f"forgezero_lifecycle._internals.{library}")
    assert module.missing() == []


def test_report_names_library_and_version(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A library lacking an internal is logged once, with its version and what falls back
    (the check itself stands in for an older asyncio: nothing older is installed)."""
    from forgezero_lifecycle._internals import asyncio as internals_asyncio

    monkeypatch.setattr(internals_asyncio, "missing", lambda: ["Event._waiters"])
    monkeypatch.setattr(_internals, "_REPORTED", set())
    with caplog.at_level(logging.WARNING, logger="forgezero_lifecycle.internals"):
        assert _internals.report(("asyncio",)) == {"asyncio": ["Event._waiters"]}
        _internals.report(("asyncio",))
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1
    assert f"version={internals_asyncio.version()}" in lines[0]
    assert "missing=Event._waiters" in lines[0]
