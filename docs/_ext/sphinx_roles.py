"""A griffe extension for the API reference: Sphinx roles in docstrings become Markdown.

The docstrings cross-reference with Sphinx roles (``:class:`~forgezero_lifecycle.Runtime```),
which mkdocstrings prints as they are. Loaded by mkdocs.yml (mkdocstrings' ``extensions``), this
turns each into inline code of the name a reader types: the last part after ``~``, the whole
path otherwise. The docstrings stay as they are for ``help()`` and editors.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj|const):`(~?)([^`]+)`")


def _plain(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    target = target.strip()
    if tilde:
        target = target.rsplit(".", 1)[-1]
    target = target.lstrip(".")
    return f"`{target}`"


def to_markdown(text: str) -> str:
    """``text`` with every Sphinx role replaced by inline code."""
    return _ROLE.sub(_plain, text)


class SphinxRolesToMarkdown(griffe.Extension):
    """Rewrite the roles of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
