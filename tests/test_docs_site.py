"""``make docs-check`` (tests/docs_site.py) sees what a reader would: a site broken on purpose.

A two-page site written here, in the classes Material gives its pages, is checked in the real
browser ``make docs-check`` uses: every kind of fault it looks for is on the first page, and the
second page is clean. Skipped, saying why, without Playwright (the ``docs-check`` extra) or a
Chromium.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import docs_site

BROKEN_PAGE = """<!doctype html>
<html><head><meta charset="utf-8">
<style>
  .md-content { width: 400px; }
  pre > code { display: block; overflow: auto; white-space: pre; }
  .md-typeset__scrollwrap { overflow: auto; }
</style>
<link rel="stylesheet" href="https://fonts.example.invalid/roboto.css">
</head><body>
<nav class="md-nav md-nav--primary">
  <a class="md-nav__link" href="./">Home</a>
  <a class="md-nav__link" href="./">Home, again</a>
  <a class="md-nav__link" href="other/">Other</a>
</nav>
<div class="md-content">
  <pre><code>LONG_CODE</code></pre>
  <div class="md-typeset__scrollwrap"><table><tr><th>wide</th>
    <td style="white-space: nowrap">LONG_CELL</td></tr></table></div>
  <a href="missing/">a page that does not exist</a>
  <a href="other/#nowhere">an anchor that does not exist</a>
  <a href="other/#here">an anchor that does</a>
  <img src="missing.png" alt="an image that does not exist">
  <pre class="mermaid"><code>graph LR; a --> b</code></pre>
  <div class="tabbed-set">
    <div class="tabbed-labels"><label>one</label><label>two</label></div>
    <div class="tabbed-content">
      <div class="tabbed-block">shown</div><div class="tabbed-block">shown as well</div>
    </div>
  </div>
</div>
<script>console.error("a console error");</script>
</body></html>
"""

CLEAN_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"></head><body>
<div class="md-content"><h1 id="here">Other</h1><a href="../">home</a></div>
</body></html>
"""


@pytest.fixture
def browser() -> str:
    pytest.importorskip("playwright", reason="Playwright: pip install -e '.[docs-check]'")
    found = docs_site.find_browser()
    if found is None:
        pytest.skip("no Chromium: apt-get install chromium, or CHROMIUM=/path/to/it")
    return found


def test_broken_site_fails_on_every_fault(
    tmp_path: Path, browser: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each fault docs-check looks for is reported on its page, and a clean page passes."""
    monkeypatch.setattr(docs_site, "MERMAID_TIMEOUT_MS", 500)  # this diagram never renders
    page = BROKEN_PAGE.replace("LONG_CODE", "x" * 200).replace("LONG_CELL", "y" * 200)
    (tmp_path / "index.html").write_text(page)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "index.html").write_text(CLEAN_PAGE)

    problems = docs_site.check_site(tmp_path, browser)

    assert set(problems) == {""}, problems
    found = "\n".join(problems[""])
    for expected in [
        "code block wider than its column",
        "table wider than its column",
        "broken link http://127.0.0.1",
        "no anchor #nowhere on /other/",
        "image did not load",
        "Mermaid diagram 1 did not render",
        "1 of 1 Mermaid diagrams did not render",
        "console error: a console error",
        "request to outside the site: https://fonts.example.invalid/roboto.css",
        "listed more than once in the navigation",
        "tab set 0: clicking 'one' shows panels [True, True]",
    ]:
        assert expected in found, found
    assert "#here" not in found, found
