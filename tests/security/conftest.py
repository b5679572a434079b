"""Fixtures of the security tests: the reliability suite's fleet of real server generations."""

from __future__ import annotations

from tests.reliability.conftest import fleet as fleet
