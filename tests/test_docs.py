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


API_PAGE: Final = (ROOT / "docs" / "api.md").read_text()


def test_api_reference_public_paths() -> None:
    """The API reference documents names under their public import paths, Runtime first."""
    documented = re.findall(r"^::: ([\w.]+)$", API_PAGE, re.MULTILINE)
    assert documented[0] == "forgezero_lifecycle.Runtime"
    private = [path for path in documented if any(p.startswith("_") for p in path.split("."))]
    assert not private, private


def test_runtime_parameters_documented() -> None:
    """Every parameter of Runtime's constructor has a line in its Args section."""
    import inspect

    from forgezero_lifecycle import Runtime

    docstring = inspect.getdoc(Runtime.__init__) or ""
    args = docstring[docstring.index("Args:") : docstring.index("Raises:")]
    described = set(re.findall(r"^    (\w+):", args, re.MULTILINE))
    assert described == set(inspect.signature(Runtime).parameters)
