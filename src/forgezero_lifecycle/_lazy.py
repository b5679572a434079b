"""A package's public names, each imported on first access (PEP 562 ``__getattr__``).

A package lists what it exports once, as the imports type checkers and IDEs read::

    from typing import TYPE_CHECKING

    from ._lazy import attach

    if TYPE_CHECKING:
        from .runtime import Runtime as Runtime

    __getattr__, __dir__, __all__ = attach(__name__)

At run time that block is skipped; :func:`attach` reads it from the package's source instead
(through its loader, so a zipped install works too; as the scientific-python ``lazy_loader``'s
``attach_stub`` reads a stub file), so ``package.Runtime`` imports ``package.runtime`` when it is
first used, and importing the package imports none of its modules. ``__all__`` is every name of
the block, in ruff's RUF022 order. An install without the ``.py`` sources (a freezer that ships
bytecode only) cannot be read and fails at import, saying so.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["attach"]


def attach(package: str) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` of ``package`` for the names its
    ``if TYPE_CHECKING:`` block imports in the ``from .module import Name as Name`` form."""
    spec = sys.modules[package].__spec__
    loader = None if spec is None else spec.loader
    get_source = getattr(loader, "get_source", None)
    source = get_source(package) if callable(get_source) else None
    if source is None:
        raise ImportError(
            f"{package}: its exports are read from its source, which is not installed"
        )
    exports = _exports(source, spec.origin if spec and spec.origin else package)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)  # later accesses skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__, sorted(exports, key=_ruf022_key)


def _exports(source: str, source_path: str) -> dict[str, str]:
    """Name -> relative module, from the top-level ``if TYPE_CHECKING:`` block of the source."""
    tree = ast.parse(source, source_path)
    blocks = [
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    ]
    if len(blocks) != 1:
        raise ImportError(f"{source_path}: expected one `if TYPE_CHECKING:` block of exports")
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


def _ruf022_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions and the rest.
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)
