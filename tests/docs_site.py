"""``make docs-check``: every page of the built site opened in headless Chromium, as a reader would.

``python tests/docs_site.py SITE [--screenshots DIR]`` serves SITE (``make docs`` builds it into
site/) on a loopback port and opens each page at 1280 x 900 px. A page fails on:

- a console error or an uncaught exception, a request of the site that failed or answered 400
  or more, or a request to anywhere but the site (the site is whole offline: no CDN, no web font);
- a Mermaid block that holds no SVG, or one that says "Syntax error";
- a code block or a table wider than its column (it would scroll sideways), or a page wider than
  the window;
- a link within the site to a page or an anchor that does not exist, an image that did not load;
- a tab that does not show its own panel when clicked;
- a page listed twice in the navigation.

Screenshots of the home page, Getting started, the API reference and the supervisor's states go
in DIR. The browser is Debian's ``chromium`` (or ``CHROMIUM=/path``), driven by Playwright (the
``docs-check`` extra); when either is missing the check is skipped with what to install, and in
CI (``CI=true``) it fails instead.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import os
import shutil
import sys
import threading
import time
from collections import Counter
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote, urlsplit

#: The window of the check: the width at which the issue's readers saw code cut off.
VIEWPORT: Final = {"width": 1280, "height": 900}
#: Pages photographed, and the file each screenshot is saved as.
SCREENSHOTS: Final = {
    "": "home.png",
    "getting-started/": "getting-started.png",
    "api/": "api-reference.png",
    "supervisor-states/": "supervisor-states.png",
}
#: Tables allowed to scroll sideways, by page and first header cell, each with why: any other
#: table wider than its column fails.
WIDE_TABLES: Final = {
    (
        "benchmarks/",
        "benchmark",
    ): "BENCHMARKS.md's results: 11 columns, as bench/_report.py writes them",
}
#: What some pages must show, so that a check with nothing to check cannot pass: page ->
#: (Mermaid diagrams, tab sets, admonitions), each at least.
EXPECTED: Final = {
    "getting-started/": (0, 1, 2),
    "drain/": (2, 0, 0),
    "deployment/": (1, 0, 0),
    "supervisor-states/": (1, 0, 0),
}
#: How long a page's Mermaid blocks may take to render, in milliseconds.
MERMAID_TIMEOUT_MS: Final = 20_000
#: Flags for Chromium on a machine with no network but loopback (no background connections).
CHROMIUM_ARGS: Final = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

#: Run before any script of a page: Material draws each diagram in a closed shadow root, which
#: the check could not look into; opened, it can.
OPEN_SHADOW_ROOTS: Final = """
const attach = Element.prototype.attachShadow;
Element.prototype.attachShadow = function (init) {
  return attach.call(this, Object.assign({}, init, { mode: "open" }));
};
"""

MERMAID_DONE: Final = """
() => [...document.querySelectorAll(".mermaid")].every(
  (host) => host.shadowRoot && host.shadowRoot.querySelector("svg"))
"""

#: What the page shows, measured in the page: one object the check reads.
MEASURE: Final = """
() => {
  const first = (el) => (el.textContent || "").trim().split("\\n")[0].slice(0, 80);
  const overflows = (el) => el.scrollWidth > el.clientWidth + 1;
  const code = [...document.querySelectorAll(".md-content pre > code")]
    .filter(overflows).map(first);
  const tables = [...document.querySelectorAll(".md-content .md-typeset__scrollwrap")]
    .filter(overflows).map(first);
  const bare = [...document.querySelectorAll(".md-content table")]
    .filter((t) => !t.closest(".md-typeset__scrollwrap"))
    .filter((t) => t.getBoundingClientRect().right >
      t.parentElement.getBoundingClientRect().right + 1).map(first);
  const mermaid = [...document.querySelectorAll(".mermaid")].map((host) => {
    const svg = host.shadowRoot && host.shadowRoot.querySelector("svg");
    const text = svg ? svg.textContent : "";
    return { svg: !!svg, error: /Syntax error|Parse error/i.test(text),
             width: svg ? svg.getBoundingClientRect().width : 0,
             column: host.parentElement.getBoundingClientRect().width };
  });
  const images = [...document.images]
    .filter((img) => !(img.complete && img.naturalWidth > 0)).map((img) => img.src);
  const links = [...document.querySelectorAll("a[href]")].map((a) => a.href);
  const ids = [...document.querySelectorAll("[id]")].map((el) => el.id);
  const nav = [...document.querySelectorAll(".md-nav--primary a.md-nav__link[href]")]
    .map((a) => a.href).filter((href) => !href.includes("#"));
  return { code, tables: tables.concat(bare), mermaid, images, links, ids, nav,
           pageWidth: document.documentElement.scrollWidth, window: window.innerWidth,
           tabSets: document.querySelectorAll(".tabbed-set").length,
           admonitions: document.querySelectorAll(".md-content .admonition").length };
}
"""


def find_browser() -> str | None:
    """The Chromium to drive: $CHROMIUM, else Debian's (or another on PATH)."""
    named = os.environ.get("CHROMIUM")
    if named:
        return named if Path(named).is_file() else None
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def skip(reason: str) -> int:
    """Say why the check did not run: a pass on a developer's machine, a failure in CI."""
    print(f"docs-check: skipped: {reason}", file=sys.stderr)
    return 1 if os.environ.get("CI") == "true" else 0


def page_paths(site: Path) -> list[str]:
    """Every page of the site, as its path under the site's root ("" for the home page)."""
    paths = []
    for index in sorted(site.rglob("index.html")):
        relative = index.parent.relative_to(site).as_posix()
        paths.append("" if relative == "." else relative + "/")
    return paths


def serve(site: Path) -> ThreadingHTTPServer:
    """A quiet HTTP server of ``site`` on a free loopback port, in a thread of its own."""

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=site))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class Visit:
    """What went wrong on the page being checked, as the browser reports it."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.problems: list[str] = []
        #: Requests to anywhere but the site: refused, and each one a problem.
        self.outside: list[str] = []

    def route(self, route: Any) -> None:
        if route.request.url.startswith(self.origin):
            route.continue_()
        else:
            self.outside.append(route.request.url)
            self.problems.append(f"request to outside the site: {route.request.url}")
            route.abort()

    def console(self, message: Any) -> None:
        if message.type == "error":
            self.problems.append(f"console error: {message.text}")

    def page_error(self, error: Any) -> None:
        self.problems.append(f"uncaught exception: {error}")

    def response(self, response: Any) -> None:
        if response.status >= 400:
            self.problems.append(f"HTTP {response.status}: {response.url}")

    def failed(self, request: Any) -> None:
        if request.url not in self.outside:  # said already
            self.problems.append(f"request failed ({request.failure}): {request.url}")


def check_tabs(page: Any) -> list[str]:
    """Click every tab of every tab set; each must show its own panel and hide the others'."""
    problems = []
    for set_index in range(page.locator(".tabbed-set").count()):
        tab_set = page.locator(".tabbed-set").nth(set_index)
        labels = tab_set.locator(":scope > .tabbed-labels > label")
        blocks = tab_set.locator(":scope > .tabbed-content > .tabbed-block")
        if labels.count() != blocks.count() or labels.count() < 2:
            problems.append(f"tab set {set_index}: {labels.count()} tabs, {blocks.count()} panels")
            continue
        for tab in range(labels.count()):
            labels.nth(tab).click()
            shown = [blocks.nth(i).is_visible() for i in range(blocks.count())]
            if shown != [i == tab for i in range(blocks.count())]:
                name = labels.nth(tab).inner_text()
                problems.append(f"tab set {set_index}: clicking {name!r} shows panels {shown}")
        labels.nth(0).click()
    return problems


def check_page(path: str, measured: dict[str, Any], diagrams: int) -> list[str]:
    """The problems a page's measurements show; ``diagrams``: the Mermaid blocks in its HTML."""
    problems = [f"code block wider than its column: {line!r}" for line in measured["code"]]
    problems += [
        f"table wider than its column: {row!r}"
        for row in measured["tables"]
        if (path, row) not in WIDE_TABLES
    ]
    if measured["pageWidth"] > measured["window"]:
        problems.append(f"page {measured['pageWidth']} px wide in a {measured['window']} px window")
    drawn = sum(diagram["svg"] for diagram in measured["mermaid"])
    if drawn < diagrams:
        problems.append(f"{diagrams - drawn} of {diagrams} Mermaid diagrams did not render")
    for number, diagram in enumerate(measured["mermaid"], 1):
        if not diagram["svg"]:
            problems.append(f"Mermaid diagram {number} did not render")
        elif diagram["error"]:
            problems.append(f"Mermaid diagram {number} rendered an error")
        elif diagram["width"] > diagram["column"] + 1:
            problems.append(f"Mermaid diagram {number} wider than its column")
    problems += [f"image did not load: {src}" for src in measured["images"]]
    expected = EXPECTED.get(path, (0, 0, 0))
    found = (len(measured["mermaid"]), measured["tabSets"], measured["admonitions"])
    if any(has < needs for has, needs in zip(found, expected, strict=True)):
        problems.append(
            "expected at least {} diagrams, {} tab sets, {} admonitions; found {}, {}, {}".format(
                *expected, *found
            )
        )
    twice = [href for href, count in Counter(measured["nav"]).items() if count > 1]
    problems += [f"listed more than once in the navigation: {href}" for href in twice]
    return problems


def check_links(
    origin: str, site: Path, links: dict[str, list[str]], ids: dict[str, set[str]]
) -> list[tuple[str, str]]:
    """Links within the site lead to a file that exists and, with a fragment, to its anchor."""
    problems = []
    for page, hrefs in links.items():
        for href in sorted(set(hrefs)):
            parts = urlsplit(href)
            if f"{parts.scheme}://{parts.netloc}" != origin:
                continue  # another site: not reachable from here, and not this site's to check
            path = unquote(parts.path).lstrip("/")
            target = site / path
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                problems.append((page, f"broken link {href}"))
            elif parts.fragment and target.name == "index.html":
                key = target.parent.relative_to(site).as_posix()
                key = "" if key == "." else key + "/"
                if key in ids and unquote(parts.fragment) not in ids[key]:
                    problems.append((page, f"no anchor #{parts.fragment} on /{key}"))
    return problems


def check_site(site: Path, browser: str, screenshots: Path | None = None) -> dict[str, list[str]]:
    """Every page of ``site`` opened in ``browser``: the problems found, by page."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    server = serve(site)
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    problems: dict[str, list[str]] = {}
    links: dict[str, list[str]] = {}
    ids: dict[str, set[str]] = {}
    if screenshots:
        screenshots.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=browser, args=CHROMIUM_ARGS)
            context = chromium.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
            context.add_init_script(OPEN_SHADOW_ROOTS)
            page = context.new_page()
            visit = Visit(origin)
            context.route("**/*", visit.route)
            page.on("console", visit.console)
            page.on("pageerror", visit.page_error)
            page.on("response", visit.response)
            page.on("requestfailed", visit.failed)
            for path in page_paths(site):
                visit.problems, visit.outside = [], []
                page.goto(f"{origin}/{path}", wait_until="load")
                if page.locator(".mermaid").count():
                    # On a timeout, the measurement below says which diagram did not render.
                    with contextlib.suppress(PlaywrightTimeout):
                        page.wait_for_function(MERMAID_DONE, timeout=MERMAID_TIMEOUT_MS)
                measured = page.evaluate(MEASURE)
                html = (site / path / "index.html").read_text(encoding="utf-8")
                diagrams = html.count('<pre class="mermaid">')
                found = check_page(path, measured, diagrams) + check_tabs(page)
                page.wait_for_load_state("networkidle")
                found += visit.problems
                links[path], ids[path] = measured["links"], set(measured["ids"])
                if found:
                    problems[path] = found
                if screenshots and path in SCREENSHOTS:
                    page.evaluate("window.scrollTo(0, 0)")
                    diagram = page.locator(".mermaid").first
                    if path == "supervisor-states/" and diagram.count():
                        diagram.scroll_into_view_if_needed()
                    page.screenshot(path=str(screenshots / SCREENSHOTS[path]))
            chromium.close()
    finally:
        server.shutdown()
        server.server_close()
    for path, problem in check_links(origin, site, links, ids):
        problems.setdefault(path, []).append(problem)
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, help="the built site (make docs: site/)")
    parser.add_argument("--screenshots", type=Path, help="where to save the screenshots")
    options = parser.parse_args()
    site: Path = options.site.resolve()
    if not (site / "index.html").is_file():
        print(f"docs-check: {site} holds no built site; run `make docs` first", file=sys.stderr)
        return 2
    browser = find_browser()
    if browser is None:
        return skip(
            "no Chromium found: install Debian's `chromium` (apt-get install chromium), "
            "or name a Chromium-based browser with CHROMIUM=/path/to/it"
        )
    if importlib.util.find_spec("playwright") is None:
        return skip("Playwright is not installed: pip install -e '.[docs-check]'")

    started = time.monotonic()
    problems = check_site(site, browser, options.screenshots)
    seconds = time.monotonic() - started
    for path, found in problems.items():
        for problem in found:
            print(f"docs-check: /{path}: {problem}", file=sys.stderr)
    pages = len(page_paths(site))
    if problems:
        print(f"docs-check: {len(problems)} of {pages} pages failed ({seconds:.0f} s)")
        return 1
    shots = f"; screenshots in {options.screenshots}" if options.screenshots else ""
    print(f"docs-check: {pages} pages checked in {browser}, all fine ({seconds:.0f} s){shots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
