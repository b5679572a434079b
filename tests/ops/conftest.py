"""Fixtures of the operations tests: the CLI tests' ``serve`` processes (started, ended by PID)."""

from __future__ import annotations

from tests.cli.conftest import start_serve

__all__ = ["start_serve"]
