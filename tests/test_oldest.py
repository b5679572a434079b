"""`make test-oldest` installs exactly the lowest versions pyproject.toml declares."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lower_bounds() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    requirements = [
        *project["project"]["dependencies"],
        *project["project"]["optional-dependencies"]["dev"],
    ]
    bounds: dict[str, str] = {}
    for requirement in requirements:
        found = re.fullmatch(r"([A-Za-z0-9_-]+)(?:\[[^\]]*\])?>=([0-9.]+)", requirement)
        if found:
            bounds[found[1].lower()] = found[2]
    return bounds


def test_oldest_are_lower_bounds() -> None:
    """Each pin of .ci/oldest-constraints.txt is the version pyproject.toml's bound names."""
    pins = dict(
        line.split("==")
        for line in (ROOT / ".ci/oldest-constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    bounds = _lower_bounds()
    assert {name: _release(bounds[name]) for name in pins} == {
        name: _release(version) for name, version in pins.items()
    }
    assert set(pins) == {
        "uvicorn",
        "starlette",
        "fastapi",
        "hypercorn",
        "httpx",
        "pydantic",
        "websockets",
    }


def _release(version: str) -> tuple[int, ...]:
    """0.30 and 0.30.0 are one release."""
    parts = [int(part) for part in version.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)
