"""A drain's deadline bound (100 ms to 10 min) is checked or clamped in one function each, and
every reader of a deadline agrees with them."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

import pytest

import forgezero_lifecycle
from forgezero_lifecycle._errors import ConfigurationError
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.serve.options import deadline_problem as flag_problem
from forgezero_lifecycle.wire._protocol import (
    MAX_DRAIN_TIMEOUT_MS,
    MIN_DRAIN_TIMEOUT_MS,
    deadline_ms,
    deadline_problem,
)

_SOURCE: Final = Path(forgezero_lifecycle.__file__).parent
_HOME: Final = _SOURCE / "wire" / "_protocol.py"
_BOUNDS: Final = frozenset({"MIN_DRAIN_TIMEOUT_MS", "MAX_DRAIN_TIMEOUT_MS"})


def _bound_used_as_a_rule(node: ast.AST) -> bool:
    """A comparison with, or a min()/max() of, a bound (by name or as the literal)."""
    if isinstance(node, ast.Compare | ast.Call) and not (
        isinstance(node, ast.Call)
        and not (isinstance(node.func, ast.Name) and node.func.id in ("min", "max"))
    ):
        for part in ast.walk(node):
            if isinstance(part, ast.Name) and part.id in _BOUNDS:
                return True
            if isinstance(part, ast.Constant) and part.value in (MAX_DRAIN_TIMEOUT_MS,):
                return True
    return False


def test_bound_applied_only_in_its_home() -> None:
    """No module but ``wire/_protocol.py`` compares with or clamps to the bound itself (the
    wire models and the OpenAPI document state it as a schema, which is no rule of code)."""
    offending = [
        f"{path.relative_to(_SOURCE)}:{getattr(node, 'lineno', 0)}"
        for path in sorted(_SOURCE.rglob("*.py"))
        if path != _HOME
        for node in ast.walk(ast.parse(path.read_text()))
        if _bound_used_as_a_rule(node)
    ]
    assert offending == []


@pytest.mark.parametrize(
    ("seconds", "clamped"),
    [(0.0, 100), (0.0994, 100), (0.1, 100), (30.0, 30_000), (600.0, 600_000), (601.0, 600_000)],
)
def test_every_reader_agrees(seconds: float, clamped: int) -> None:
    """The flags, the runtime's signal deadline and the clamp agree on every value."""
    within = MIN_DRAIN_TIMEOUT_MS <= round(seconds * 1000) <= MAX_DRAIN_TIMEOUT_MS
    assert deadline_ms(seconds) == clamped
    assert (deadline_problem(round(seconds * 1000)) is None) is within
    assert (flag_problem(seconds) is None) is within
    if within:
        Runtime(insecure_loopback_control=True, signal_drain_timeout=seconds)
    else:
        with pytest.raises(ConfigurationError):
            Runtime(insecure_loopback_control=True, signal_drain_timeout=seconds)
