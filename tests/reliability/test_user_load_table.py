"""docs/servers.md's user-load table is the reliability report's (``user_load_table.py``)."""

from __future__ import annotations

import json

import pytest

from . import user_load_table as t
from ._rows import ROWS


def _entry(name: str, **counts: object) -> str:
    base = {
        "scenario": f"user-load-{name}",
        "requests": 3000,
        "lost": 0,
        "lost_before_stop": 0,
        "refused_before_stop": 0,
        "stop_seconds": 4.5,
        "burst_start": None,
        "burst_handover": None,
    }
    return json.dumps({**base, **counts})


def test_rows_render_from_their_runs() -> None:
    """Each row's runs become one line: per-run losses before and at the stop, the ranges of
    requests and stop times, and each burst's split over the workers."""
    lines = [
        _entry("serve-workers", requests=2900, stop_seconds=2.7, burst_start=[24, 26],
               burst_handover=[[25, 25]]),
        _entry("serve-workers", requests=3100, stop_seconds=3.1, burst_start=[23, 27]),
        _entry("hypercorn", lost=14, stop_seconds=5.0),
        json.dumps({"scenario": "two-sighups", "lost": 9}),  # another scenario: left out
    ]  # fmt: skip
    rendered = t.table(t.runs(lines)).splitlines()
    assert rendered[:2] == t.HEADER.splitlines()
    assert len(rendered) == 2 + len(ROWS)
    by_title = {line.split(" | ")[0].removeprefix("| "): line for line in rendered[2:]}
    assert by_title["`serve --workers 2`"] == (
        f"| `serve --workers 2` | 2 | 2900{t.EN_DASH}3100 | 0, 0 | 0, 0 | 0, 0 | 2.7{t.EN_DASH}3.1 s "
        "| 24/26, 25/25, 23/27 |"
    )
    assert by_title["hypercorn `--workers 0` (HTTP/1.1 and h2c)"] == (
        "| hypercorn `--workers 0` (HTTP/1.1 and h2c) | 1 | 3000 | 0 | 14 | 0 | 5 s | — |"
    )
    assert by_title["`uvicorn`"] == "| `uvicorn` | not run | | | | | | |"


def test_committed_table_has_every_row_in_order() -> None:
    """The table in docs/servers.md has the renderer's header and one line per row of
    ``_rows.py``, each with a run (it was written from a report, not by hand)."""
    lines = t.committed().splitlines()
    assert lines[:2] == t.HEADER.splitlines()
    titles = [line.split(" | ")[0].removeprefix("| ") for line in lines[2:]]
    assert titles == [t.TITLES[row.name] for row in ROWS]
    columns = t.HEADER.splitlines()[0].count("|")
    for line in lines[2:]:
        assert line.count("|") == columns, line
        assert "not run" not in line, line


def test_page_without_markers_refused() -> None:
    with pytest.raises(ValueError, match="user-load:begin"):
        t.replace("no table here", "| x |")
