"""MkDocs hooks of the site (mkdocs.yml's ``hooks``): root files shown in place, local Mermaid.

**Root files in place.** BENCHMARKS.md (written by ``make bench``), RELIABILITY.md and
CHANGELOG.md stay at the repository's root, one copy each. A page shows one of them with a block
that reads as a link on the repository's own view of docs/ and is replaced by the file on the
site::

    <!-- include ../BENCHMARKS.md level=2 -->
    The last run's report: [BENCHMARKS.md](../BENCHMARKS.md).
    <!-- end include -->

The path is relative to the page; ``level=N`` (optional) moves the file's headings so that its
top one is of level N. A path that does not exist fails the build.

**Mermaid from the site.** Material draws ``mermaid`` fences with the Mermaid it finds loaded in
the page, and loads it from a CDN otherwise. When ``FORGEZERO_DOCS_MERMAID`` names a
``mermaid.min.js`` (``make docs`` takes it from the npm registry's ``mermaid`` package), it is
copied into the site and loaded, before Material's own script, by the pages that have a diagram:
the site then draws its diagrams offline.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.utils import get_relative_url

_INCLUDE = re.compile(
    r"^<!-- include (?P<path>\S+)(?: level=(?P<level>[1-6]))? -->\n.*?^<!-- end include -->$",
    re.MULTILINE | re.DOTALL,
)
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6}) ")

#: Where the site serves Mermaid, when FORGEZERO_DOCS_MERMAID names a file.
MERMAID_URL = "assets/javascripts/mermaid.min.js"
_BUNDLE = re.compile(r'<script src="[^"]*assets/javascripts/bundle\.[0-9a-f]+\.min\.js"></script>')


def _shift_headings(text: str, level: int) -> str:
    """``text`` with its headings moved so that the top one is of ``level`` (code left alone)."""
    lines, inside = text.splitlines(keepends=True), False
    levels = []
    for line in lines:
        if _FENCE.match(line):
            inside = not inside
        elif not inside and (heading := _HEADING.match(line)):
            levels.append(len(heading.group(1)))
    if not levels:
        return text
    shift = level - min(levels)
    shifted, inside = [], False
    for line in lines:
        if _FENCE.match(line):
            inside = not inside
        elif not inside and (heading := _HEADING.match(line)):
            new = min(6, max(1, len(heading.group(1)) + shift))
            line = "#" * new + line[len(heading.group(1)) :]
        shifted.append(line)
    return "".join(shifted)


def on_page_markdown(markdown: str, *, page: Any, **kwargs: Any) -> str:
    """Replace each include block of the page by the file it names."""
    folder = Path(page.file.abs_src_path).parent

    def include(match: re.Match[str]) -> str:
        path = (folder / match["path"]).resolve()
        if not path.is_file():
            raise PluginError(f"{page.file.src_path}: include of a missing file {match['path']}")
        text = path.read_text(encoding="utf-8")
        if match["level"]:
            text = _shift_headings(text, int(match["level"]))
        return text.rstrip("\n")

    return _INCLUDE.sub(include, markdown)


def _mermaid_source() -> Path | None:
    named = os.environ.get("FORGEZERO_DOCS_MERMAID")
    if not named:
        return None
    path = Path(named)
    if not path.is_file():
        raise PluginError(f"FORGEZERO_DOCS_MERMAID={named}: no such file")
    return path


def on_files(files: Files, *, config: Any) -> Files:
    """Add the local Mermaid to the site's files."""
    source = _mermaid_source()
    if source is not None:
        files.append(
            File.generated(config, MERMAID_URL, abs_src_path=str(source.resolve()))
        )
    return files


def on_post_page(output: str, *, page: Any, config: Any) -> str:
    """Load the local Mermaid, before Material's script, on a page that has a diagram."""
    if _mermaid_source() is None or 'class="mermaid"' not in output:
        return output
    url = get_relative_url(MERMAID_URL, page.url)
    tag = f'<script src="{url}"></script>'
    bundle = _BUNDLE.search(output)
    if bundle is None:
        raise PluginError(f"{page.file.src_path}: Material's script not found for Mermaid")
    return output[: bundle.start()] + tag + output[bundle.start() :]
