"""``serve`` processes for the stop tests: the CLI tests' fixture, shared."""

from tests.cli.conftest import start_serve

__all__ = ["start_serve"]
