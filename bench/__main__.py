"""``python -m bench [--quick]``: every benchmark in turn, one table, and BENCHMARKS.md.

The modules run one after the other in this process (each also runs alone as
``python -m bench.<name>``), so no two of them compete for the machine's two cores. A module
that fails is reported and the others still run; the exit status is then 1. A full run writes
BENCHMARKS.md (``--output`` elsewhere); a quick run is a smoke check that only prints, unless
``--output`` is given. PostgreSQL rows (``bench.jobs``, ``bench.jobs_peer``) need
``FORGEZERO_BENCH_POSTGRES_DSN`` or ``--postgres-dsn``; the peers compared against come with
``pip install -e '.[bench]'`` (``make bench`` installs them). A comparison that cannot run (no
DSN, a peer not installed, a module that failed) is a row saying ``not run`` and why.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Final

from bench._load import loader_name
from bench._report import machine, markdown, not_run, print_table

MODULES: Final = (
    "middleware",
    "server",
    "instructions",
    "drain_latency",
    "canonical",
    "handoff",
    "handover",
    "recycling",
    "scaling",
    "jobs",
    "jobs_peer",
    "memory",
    "queue",
)
DEFAULT_OUTPUT: Final = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke run, about 3 minutes")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(MODULES)}")
    parser.add_argument("--output", type=Path, help="where to write the report")
    parser.add_argument("--postgres-dsn", help="PostgreSQL for the job rows")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(MODULES)
    unknown = sorted(set(names) - set(MODULES))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {MODULES}")
    if args.postgres_dsn:
        os.environ["FORGEZERO_BENCH_POSTGRES_DSN"] = args.postgres_dsn
    command = ".venv/bin/python -m bench" + (" --quick" if args.quick else "")
    if args.only:
        command += f" --only {args.only}"
    rows: list[dict[str, Any]] = []
    failed = False
    started = time.monotonic()
    for name in names:
        began = time.monotonic()
        print(f"bench.{name} ...", file=sys.stderr, flush=True)
        try:
            produced = importlib.import_module(f"bench.{name}").run(args.quick)
        except Exception as exc:
            traceback.print_exc()
            failed = True
            reason = f"the module failed: {type(exc).__name__}: {exc}"
            rows.append(not_run(f"bench.{name}", reason, f"{command} (python -m bench.{name})"))
            continue
        rows += produced
        print(f"bench.{name}: {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
    elapsed = time.monotonic() - started
    print()
    print_table(rows)
    print(f"\n{len(rows)} rows in {elapsed:.0f} s")
    output = args.output or (None if args.quick else DEFAULT_OUTPUT)
    if output is not None:
        info = {**machine(), "HTTP load generator": loader_name()}
        text = markdown(rows, info, command=command, elapsed=elapsed)
        output.write_text(text, encoding="utf-8")
        print(f"wrote {output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
