"""The path a request names inside the app: ``scope["path"]`` without the ``root_path`` prefix.

Servers put the mount prefix in both (ASGI 3: ``path`` includes ``root_path``), so every place
that matches control paths strips it the same way, here.
"""

from __future__ import annotations

from ._types import Scope

__all__ = ["app_path"]


def app_path(scope: Scope) -> str:
    """``scope["path"]`` with ``scope["root_path"]`` removed when it is a prefix of it."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :]
    return path
