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


#: The widest code line that fits a code block's column at 1280 px without scrolling.
MAX_CODE_LINE: Final = 88
#: Pages whose code still has wider lines, each to be split (options into tables); a page fixed
#: leaves this set, and no page may join it.
WIDE_CODE_PAGES: Final = frozenset({"benchmarks.md", "contributing.md", "deployment.md", "jobs.md"})


def _code_lines(text: str) -> list[tuple[int, str]]:
    lines, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if re.match(r"^\s*```", line):
            inside = not inside
        elif inside:
            lines.append((number, line))
    return lines


def test_code_lines_fit() -> None:
    """No code line in docs/ is wider than 88 characters (options go in tables, not comments)."""
    wide = {}
    for page in sorted((ROOT / "docs").glob("*.md")):
        found = [n for n, line in _code_lines(page.read_text()) if len(line) > MAX_CODE_LINE]
        if found:
            wide[page.name] = found
    assert set(wide) <= WIDE_CODE_PAGES, {k: v for k, v in wide.items() if k not in WIDE_CODE_PAGES}
    assert not WIDE_CODE_PAGES - set(wide), "fixed: remove it from WIDE_CODE_PAGES"


def test_no_include_lines_in_linked_pages() -> None:
    """The pages the README links to read whole on the repository view: no `--8<--` includes."""
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", readme))
    assert "getting-started.md" in linked
    including = {
        name
        for name in linked
        if re.search(r"^\s*-{2}8<-{2}", (ROOT / "docs" / name).read_text(), re.MULTILINE)
    }
    # jobs.md, deployment.md and benchmarks.md still include their example files.
    assert including <= {"jobs.md", "deployment.md", "benchmarks.md"}, including
    assert "getting-started.md" not in including
