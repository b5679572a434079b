"""docs/ says what the code does where a page lists the code's own names, and reads whole.

The wire protocol page's table lists every control path the package defines (the supervisor's
included) and nothing else; the API reference starts with Runtime under public paths. Every code
line fits 88 columns, no page has an include line, and a page's copy of an example file is that
file. The site itself is built by ``make docs`` (``mkdocs --strict``: a broken link, anchor or
API reference fails) and opened page by page in Chromium by ``make docs-check``
(tests/docs_site.py), in CI after ``make lint``.
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


def _code_lines(text: str) -> list[tuple[int, str]]:
    lines, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if re.match(r"^\s*```", line):
            inside = not inside
        elif inside:
            lines.append((number, line))
    return lines


def test_code_lines_fit() -> None:
    """No code line in docs/ or the README is wider than 88 characters (options in tables)."""
    wide = {}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found = [n for n, line in _code_lines(page.read_text()) if len(line) > MAX_CODE_LINE]
        if found:
            wide[page.name] = found
    assert not wide


def test_no_include_lines() -> None:
    """Every page reads whole on the repository view: no `--8<--` include lines."""
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", readme))
    assert "getting-started.md" in linked
    including = [
        page.name
        for page in sorted((ROOT / "docs").glob("*.md"))
        if re.search(r"^\s*;*-+8<-+", page.read_text(), re.MULTILINE)
    ]
    assert not including


#: A code block that copies a file of the repository: the marker names the file.
COPY: Final = re.compile(
    r"^<!-- copy of (?P<path>\S+): tests/test_docs.py keeps the two equal -->\n"
    r"```[^\n]*\n(?P<code>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)


def test_copied_code_equals_its_file() -> None:
    """A page's copy of an example file is that file, character for character."""
    copies = [
        (page.name, match)
        for page in sorted((ROOT / "docs").glob("*.md"))
        for match in COPY.finditer(page.read_text())
    ]
    assert {match["path"] for _, match in copies} >= {
        "examples/jobs/app.py",
        "examples/jobs/app_postgres.py",
        "examples/compose/compose.yaml",
    }
    for page, match in copies:
        assert match["code"] == (ROOT / match["path"]).read_text(), (page, match["path"])


#: A block that shows a root file on the site, and a link to it on the repository's view
#: (docs/_ext/hooks.py).
ROOT_FILE: Final = re.compile(
    r"^<!-- include (?P<path>\S+)(?: level=\d)? -->\n(?P<shown>.*?)^<!-- end include -->$",
    re.MULTILINE | re.DOTALL,
)


def test_root_files_linked_on_repository_view() -> None:
    """A page that shows a root file on the site links to the same file on the repository view."""
    blocks = [
        (page, match)
        for page in sorted((ROOT / "docs").glob("*.md"))
        for match in ROOT_FILE.finditer(page.read_text())
    ]
    assert {page.name for page, _ in blocks} >= {"benchmarks.md", "changelog.md", "reliability.md"}
    for page, match in blocks:
        assert (page.parent / match["path"]).is_file(), (page.name, match["path"])
        assert f"]({match['path']})" in match["shown"], (page.name, match["shown"])


def test_docs_check_names_pages_that_exist() -> None:
    """The pages make docs-check photographs or counts the diagrams of are pages of docs/."""
    from tests import docs_site

    for path in [*docs_site.EXPECTED, *docs_site.SCREENSHOTS]:
        assert path == "" or (ROOT / "docs" / f"{path.rstrip('/')}.md").is_file(), path
