"""docs/ says what the code does where a page lists the code's own names.

The wire protocol page's table lists every control path the package defines (the supervisor's
included) and nothing else. The site itself is built by ``make docs`` (``mkdocs --strict``: a
broken link, anchor or API reference fails), in CI after ``make lint``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from forgezero_lifecycle.wire import paths

ROOT: Final = Path(__file__).resolve().parents[1]
WIRE_PAGE: Final = (ROOT / "docs" / "wire.md").read_text()
PREFIX: Final = "/.forgezero/runtime/"


def test_wire_table_paths() -> None:
    """The wire table lists every control path and no other."""
    start = WIRE_PAGE.index("| method, path")
    table = WIRE_PAGE[start : WIRE_PAGE.index("\n\n", start)]
    written = set()
    for row in table.splitlines()[2:]:
        first_column = row.split("|")[1]
        routes = re.findall(r"`(?:GET|POST) ([^`?]+)", first_column)
        assert routes, row
        written |= {PREFIX + path for path in routes}
    defined = {getattr(paths, name) for name in dir(paths) if name.endswith("_PATH")}
    assert written == defined
