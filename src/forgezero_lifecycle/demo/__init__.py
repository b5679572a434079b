"""The demo: two generations of a small app hand over under load, and nothing is lost.

``forgezero-lifecycle demo`` (or ``make demo``) runs it on loopback in under a minute.
"""

from __future__ import annotations

import argparse

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``demo`` command's flags."""
    parser.epilog = (
        "exit codes:\n  0  nothing was lost\n  1  something was lost, or the demo failed\n"
    )
    parser.add_argument("--short", action="store_true", help="a smaller, faster run (CI)")
    parser.add_argument("--postgres", metavar="DSN", help="keep durable jobs in PostgreSQL")


def main(args: argparse.Namespace) -> int:
    """Run the demo; exit code 0 only when nothing was lost."""
    from .orchestrate import run_demo

    return run_demo(short=args.short, postgres=args.postgres)
