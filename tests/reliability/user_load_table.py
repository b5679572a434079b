"""docs/servers.md's user-load table, made from the reliability report (not a test module).

Every run of ``test_user_load.py`` appends its figures to ``FORGEZERO_RELIABILITY_REPORT`` when
that is set (``_soak.report``). This turns the report's ``user-load-*`` lines into the table that
docs/servers.md prints between its ``user-load`` markers, so that the figures the docs quote are
the runs' own::

    FORGEZERO_RELIABILITY_REPORT=/tmp/report.jsonl make test PYTEST_ARGS=tests/reliability/test_user_load.py
    .venv/bin/python -m tests.reliability.user_load_table /tmp/report.jsonl --write

Without ``--write`` the table is printed. ``test_user_load_table.py`` checks that the committed
table has the rows of ``_rows.py``, in their order, with the renderer's columns.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

from ._rows import ROWS, Row

#: Between the ends of a range, as the rest of the docs write it.
EN_DASH: Final = "\N{EN DASH}"
ROOT: Final = Path(__file__).resolve().parents[2]
PAGE: Final = ROOT / "docs" / "servers.md"
BEGIN: Final = "<!-- user-load:begin (tests/reliability/user_load_table.py) -->"
END: Final = "<!-- user-load:end -->"
HEADER: Final = (
    "| row | runs | requests a run | lost before the stop | lost at the stop "
    "| refused before the stop | stop after SIGTERM | bursts per worker |\n"
    "|---|---|---|---|---|---|---|---|"
)
#: How each row is named in the docs.
TITLES: Final = {
    "serve": "`serve`",
    "serve-workers": "`serve --workers 2`",
    "uvicorn": "`uvicorn`",
    "uvicorn-workers": "`uvicorn --workers 2`",
    "gunicorn-ours": "gunicorn + `forgezero_lifecycle.gunicorn.UvicornWorker`",
    "gunicorn-uvicorn-worker": "gunicorn + `uvicorn_worker.UvicornWorker`",
    "hypercorn": "hypercorn `--workers 0` (HTTP/1.1 and h2c)",
}


def runs(lines: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """The report's user-load runs per row name, in the report's order."""
    found: dict[str, list[dict[str, Any]]] = {row.name: [] for row in ROWS}
    for line in lines:
        if not line.strip():
            continue
        entry = json.loads(line)
        name = str(entry.get("scenario", "")).removeprefix("user-load-")
        if name in found and entry.get("scenario", "").startswith("user-load-"):
            found[name].append(entry)
    return found


def table(per_row: dict[str, list[dict[str, Any]]]) -> str:
    """The markdown table: one line per row of ``_rows.py``, "not run" where the report has no
    run of it."""
    return "\n".join([HEADER, *(_line(row, per_row.get(row.name, [])) for row in ROWS)])


def _line(row: Row, entries: Sequence[dict[str, Any]]) -> str:
    title = TITLES[row.name]
    if not entries:
        return f"| {title} | not run | | | | | | |"
    requests = _span(e["requests"] for e in entries)
    before = ", ".join(str(e["lost_before_stop"]) for e in entries)
    at_stop = ", ".join(str(e["lost"] - e["lost_before_stop"]) for e in entries)
    refused = ", ".join(str(e["refused_before_stop"]) for e in entries)
    stops = _span((e["stop_seconds"] for e in entries), unit=" s")
    bursts = "—"
    if row.workers > 1:
        shares = [
            "/".join(str(n) for n in burst)
            for e in entries
            for burst in [e["burst_start"], *(e.get("burst_handover") or [])]
            if burst
        ]
        bursts = ", ".join(shares) or "—"
    return f"| {title} | {len(entries)} | {requests} | {before} | {at_stop} | {refused} | {stops} | {bursts} |"


def _span(values: Iterable[float], unit: str = "") -> str:
    ordered = sorted(values)
    low, high = ordered[0], ordered[-1]
    return f"{low:g}{unit}" if low == high else f"{low:g}{EN_DASH}{high:g}{unit}"


def replace(page: str, new_table: str) -> str:
    """``page`` with the text between the markers replaced by ``new_table``."""
    pattern = re.compile(re.escape(BEGIN) + r"\n(?:.*?\n)?" + re.escape(END), re.DOTALL)
    if not pattern.search(page):
        raise ValueError(f"{PAGE.name} has no {BEGIN} … {END} block")
    return pattern.sub(lambda _: f"{BEGIN}\n{new_table}\n{END}", page)


def committed() -> str:
    """The table docs/servers.md holds now."""
    page = PAGE.read_text(encoding="utf-8")
    start = page.index(BEGIN) + len(BEGIN) + 1
    return page[start : page.index(END, start)].rstrip("\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "reports", nargs="+", type=Path, help="reliability report files (JSON lines)"
    )
    parser.add_argument("--write", action="store_true", help=f"write the table into {PAGE.name}")
    args = parser.parse_args(argv)
    lines = [line for path in args.reports for line in path.read_text().splitlines()]
    rendered = table(runs(lines))
    if args.write:
        PAGE.write_text(replace(PAGE.read_text(encoding="utf-8"), rendered), encoding="utf-8")
    else:
        print(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
