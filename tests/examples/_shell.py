"""Run a page's commands in one bash shell, as a reader would paste them, and end what they start.

The shell gets its own process group (so ``serve``, started with ``&``, is ended with it whatever
happens) and the virtual environment's ``bin`` first on ``PATH``. Where no ``curl`` is installed
a Python stand-in for the forms the pages use (``-s``, ``-X METHOD``, ``-H``, ``-d``, a URL) is
defined, so the tests need nothing but Python, as ``make test`` promises.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Final

#: How long a page's commands may take, start to exit, on a loaded machine.
BOUND: Final = 120

CURL_FALLBACK: Final = """command -v curl > /dev/null || curl() {
  python - "$@" <<'PY'
import sys, httpx
args, method, headers, body, url = sys.argv[1:], None, {}, None, None
while args:
    arg, args = args[0], args[1:]
    if arg == "-X":
        method, args = args[0], args[1:]
    elif arg == "-H":
        name, _, value = args[0].partition(":")
        headers[name.strip()] = value.strip()
        args = args[1:]
    elif arg == "-d":
        body, args = args[0], args[1:]
    elif arg != "-s":
        url = arg if "://" in arg else "http://" + arg
method = method or ("POST" if body is not None else "GET")
answer = httpx.request(method, url, headers=headers, content=body, trust_env=False)
sys.stdout.write(answer.text)
PY
}
"""


def clean_env() -> dict[str, str]:
    """This process's environment without the settings a page exports, the venv first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FORGEZERO_", "JOBS_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_shell(script: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """Run ``script`` under ``set -euo pipefail``; its exit code and its merged output."""
    shell = subprocess.Popen(
        ["bash", "-c", "set -euo pipefail\n" + CURL_FALLBACK + script],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = shell.communicate(timeout=BOUND)
    finally:
        with contextlib.suppress(ProcessLookupError):  # serve too, were it left behind
            os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()
    return shell.returncode, out
