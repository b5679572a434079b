"""Loading the conformance vectors: data produced by running the JavaScript original.

The original is the JavaScript `@forgezero/runtime` lifecycle module."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

VECTORS_PATH = Path(__file__).with_name("vectors.json")


@cache
def _document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
    return document


def constants() -> dict[str, Any]:
    result: dict[str, Any] = _document()["meta"]["constants"]
    return result


def vectors(*categories: str) -> list[dict[str, Any]]:
    """Every vector of the given categories, in file order."""
    return [v for v in _document()["vectors"] if v["category"] in categories]


def expected(vector: dict[str, Any]) -> dict[str, Any]:
    """The outcome the port must produce: ``port.expected`` where the port deliberately differs."""
    result: dict[str, Any] = vector["port"]["expected"] if "port" in vector else vector["expected"]
    return result


def counts() -> dict[str, int]:
    result: dict[str, int] = _document()["meta"]["counts"]
    return result
