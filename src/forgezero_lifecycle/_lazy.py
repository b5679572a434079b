"""A package's public names, each imported on first access (PEP 562 ``__getattr__``).

A package lists what it exports once, as the imports type checkers and IDEs read::

    from typing import TYPE_CHECKING

    from ._lazy import attach

    if TYPE_CHECKING or not attach(__name__):
        from .runtime import Runtime as Runtime

At run time :func:`attach` reads that block from the package's source instead (through its
loader, so a zipped install works too; as anyio's lazy importer and the scientific-python
``lazy_loader``'s ``attach_stub`` do), installs the package's ``__getattr__``, ``__dir__`` and
``__all__`` and returns True, so the block is skipped: ``package.Runtime`` imports
``package.runtime`` when it is first used, and importing the package imports none of its modules.
``__all__`` is every name of the block, in ruff's RUF022 order. Where the source is not installed
(a freezer that ships bytecode only) it returns False and the block runs: every name is imported
at once, and ``__all__`` is still the names the block bound.

``moved`` maps names the package no longer exports to the absolute module that does: an access
still works, with a :class:`DeprecationWarning` naming the one import path to use.
"""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from collections.abc import Mapping
from types import ModuleType
from typing import Any

__all__ = ["attach"]


def attach(package: str, *, moved: Mapping[str, str] | None = None) -> bool:
    """Make the names of ``package``'s ``if TYPE_CHECKING or not attach(__name__):`` block
    (``from .module import Name as Name`` imports) lazy; False when its source cannot be read,
    so that the block runs eagerly."""
    module = sys.modules[package]
    namespace = vars(module)
    spec = module.__spec__
    loader = None if spec is None else spec.loader
    get_source = getattr(loader, "get_source", None)
    try:
        source = get_source(package) if callable(get_source) else None
    except (ImportError, OSError):  # a loader that finds bytecode only may raise instead
        source = None
    aliases = dict(moved or {})
    if source is None:
        _install_eager(package, namespace, aliases)
        return False
    exports = _exports(source, spec.origin if spec and spec.origin else package)

    def __getattr__(name: str) -> Any:
        target = exports.get(name)
        if target is None:
            return _moved(package, name, aliases)
        value = getattr(importlib.import_module(target, package), name)
        namespace[name] = value  # later accesses skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    namespace.update(
        __getattr__=__getattr__, __dir__=__dir__, __all__=sorted(exports, key=_ruf022_key)
    )
    return True


def _install_eager(package: str, namespace: dict[str, Any], aliases: dict[str, str]) -> None:
    # Every name bound after this call, but the submodules the imports bind, is one the block
    # imports: __all__ is read on first use.
    before = set(namespace) | {"__getattr__"}

    def __getattr__(name: str) -> Any:
        if name == "__all__":
            bound = (key for key in set(namespace) - before)
            names = sorted(
                (key for key in bound if not isinstance(namespace[key], ModuleType)),
                key=_ruf022_key,
            )
            namespace["__all__"] = names
            return names
        return _moved(package, name, aliases)

    namespace["__getattr__"] = __getattr__


def _moved(package: str, name: str, aliases: dict[str, str]) -> Any:
    home = aliases.get(name)
    if home is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    warnings.warn(
        f"{package}.{name} is deprecated: import {name} from {home}",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(importlib.import_module(home), name)


def _exports(source: str, source_path: str) -> dict[str, str]:
    """Name -> relative module, from the top-level exports block of the source."""
    tree = ast.parse(source, source_path)
    blocks = [node for node in tree.body if isinstance(node, ast.If) and _is_exports(node.test)]
    if len(blocks) != 1:
        raise ImportError(
            f"{source_path}: expected one `if TYPE_CHECKING or not attach(__name__):` block "
            "of exports"
        )
    exports: dict[str, str] = {}
    for statement in blocks[0].body:
        if not isinstance(statement, ast.ImportFrom) or statement.level == 0:
            raise ImportError(
                f"{source_path}:{statement.lineno}: the exports block holds only relative "
                "`from .module import Name as Name` imports"
            )
        module = "." * statement.level + (statement.module or "")
        for alias in statement.names:
            if alias.asname != alias.name:
                raise ImportError(
                    f"{source_path}:{statement.lineno}: write `{alias.name} as {alias.name}` "
                    "(the explicit re-export type checkers read)"
                )
            exports[alias.name] = module
    return exports


def _is_exports(test: ast.expr) -> bool:
    """``TYPE_CHECKING or not attach(...)``."""
    return (
        isinstance(test, ast.BoolOp)
        and isinstance(test.op, ast.Or)
        and isinstance(test.values[0], ast.Name)
        and test.values[0].id == "TYPE_CHECKING"
    )


def _ruf022_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions and the rest.
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)
