"""Instructions per request under a real server, counted by valgrind: bare app vs the runtime.

``bench.server``'s requests/s rows move by several per cent from run to run on a shared 2-core
machine, more than the overhead they are there to show. This module counts what the same
servers execute instead, which no other load on the machine changes: each variant of
``bench.server``'s app families (``bench/apps/hello.py``) is served by the same uvicorn command
(httptools, one worker) under ``valgrind --tool=callgrind``, and a client in this process sends
it ``N`` requests one after another on one keep-alive connection. Two runs per variant, with
:data:`FEW` and :data:`MANY` requests, give the instructions of one request, start-up and
shutdown cancelled out: ``(I(MANY) - I(FEW)) / (MANY - FEW)``, everything the server process
executes for it (the event loop, httptools, uvicorn, the app, the runtime).

The ratio to bare is the share of CPU work a request adds. For a server that is CPU-bound (as
under ``bench.server``'s load), requests/s ≥ 0.97 of bare allows 1/0.97 = 3.1 % more work per
request, ≥ 0.99 allows 1.0 %. What moves the count a little from run to run (about 0.15 % of a
hello request) is uvicorn's own clock: its main loop wakes every 0.1 s and the request takes
longer under valgrind on a busy machine. Without valgrind on ``PATH`` every row says so.

Run ``python -m bench.instructions [--quick]``.
"""

from __future__ import annotations

import argparse
import itertools
import re
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

from bench._report import not_run, print_table, row
from bench.server import FAMILIES, PATH, start_servers, stop_servers

__all__ = ["run"]

#: The rows with a target: the runtime under the raw app, where nothing but the library's own
#: request path is added to a bare app's (at most 2.5 % more instructions per request).
TARGETS: Final = {("raw ASGI hello", "runtime"): "ratio ≤ 1.025"}
FEW: Final = 500
MANY: Final = 3_500
#: Under valgrind a server starts and stops about 50 times slower than without.
STARTUP_TIMEOUT: Final = 240.0
STOP_TIMEOUT: Final = 120.0
_COLLECTED: Final = re.compile(r"Collected\s*:\s*([\d,]+)")
_RUNS: Final = itertools.count()
_REQUEST: Final = f"GET {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def _send_requests(url: str, count: int) -> None:
    """``count`` requests in turn on one keep-alive connection; each must answer 200."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        for _ in range(count):
            conn.sendall(_REQUEST)
            _read_response(conn)


def _read_response(conn: socket.socket) -> None:
    received = b""
    while b"\r\n\r\n" not in received:
        received += _recv(conn)
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    if not lines[0].startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"the server answered {lines[0]!r}")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in lines
            if line.lower().startswith(b"content-length")
        ),
        None,
    )
    if length is None:
        raise RuntimeError("the hello response has no content-length")
    while len(body) < length:
        body += _recv(conn)


def _recv(conn: socket.socket) -> bytes:
    data = conn.recv(65536)
    if not data:
        raise RuntimeError("the server closed the connection")
    return data


def _instructions(target: str, requests: int, log_dir: Path) -> int:
    """What one uvicorn process serving ``target`` executes, start to exit, for ``requests``."""
    out = log_dir / f"callgrind-{next(_RUNS)}"
    wrapper = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}.out",
        f"--log-file={out}.log",
    ]
    # A fixed hash seed: string hashing would otherwise change dict layouts from run to run.
    environment = [{"PYTHONHASHSEED": "0"}]
    (server,) = start_servers(
        [target],
        log_dir,
        environment,
        wrapper=wrapper,
        startup_timeout=STARTUP_TIMEOUT,
        cli_module="bench._quiet_uvicorn",
    )
    try:
        _send_requests(server.url, requests)
    finally:
        stop_servers([server], timeout=STOP_TIMEOUT)
    found = _COLLECTED.search(Path(f"{out}.log").read_text(errors="replace"))
    if found is None:
        raise RuntimeError(f"valgrind reported no count for {target}:\n{server.log()}")
    return int(found.group(1).replace(",", ""))


def _per_request(target: str, few: int, many: int, log_dir: Path) -> float:
    return (_instructions(target, many, log_dir) - _instructions(target, few, log_dir)) / (
        many - few
    )


def run(quick: bool) -> list[dict[str, Any]]:
    """Rows of instructions per request, per app family and contender, against bare."""
    few, many = (200, 1_200) if quick else (FEW, MANY)
    command = ".venv/bin/python -m bench.instructions" + (" --quick" if quick else "")
    families = FAMILIES[:1] if quick else FAMILIES
    if shutil.which("valgrind") is None:
        reason = "valgrind is not installed (Debian: apt-get install valgrind)"
        return [not_run(f"instructions.{family.name}", reason, command) for family in families]
    note = (
        f"uvicorn --http httptools --workers 1 under valgrind --tool=callgrind; "
        f"(I({many:,} requests) - I({few:,})) / {many - few:,}, one keep-alive connection"
    )
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fz-bench-instructions-") as tmp:
        log_dir = Path(tmp)
        for family in families:
            bare = _per_request(family.bare, few, many, log_dir)
            budget = 1 / family.target
            for label, target in family.contenders.items():
                if quick and label in family.references:
                    continue  # quick mode: bare and the runtime only
                ours = _per_request(target, few, many, log_dir)
                rows.append(
                    row(
                        f"instructions.{family.name} +{label}",
                        "instructions per request, whole server process",
                        "instructions",
                        [ours],
                        baseline=bare,
                        ratio=round(ours / bare, 4),
                        target=TARGETS.get((family.name, label), "(comparison)"),
                        command=command,
                        note=(
                            f"{note}; added {ours - bare:,.0f} per request "
                            f"({(ours / bare - 1) * 100:.2f} %); requests/s ≥ {family.target} "
                            f"of bare allows {(budget - 1) * 100:.1f} % on a CPU-bound server"
                        ),
                    )
                )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--quick", action="store_true", help="the raw family without the counter, fewer requests"
    )
    print_table(run(parser.parse_args(argv).quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
