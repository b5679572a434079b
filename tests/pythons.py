"""``make test-pythons``: the suite on every CPython 3.11+ this machine has (not a test module).

Each interpreter is found under pyenv (``$PYENV_ROOT/versions/3.x.y``, ``~/.pyenv`` when unset)
or on ``PATH`` as ``python3.x``; the newest patch release of each minor version is used, and
free-threaded builds are left out. Each gets its own virtual environment, ``.venv-3.x``, with
``pip install -e '.[dev]'`` (again whenever pyproject.toml changed). Then, one version after the
other: the whole suite on the oldest and the newest, and on the others the real-server tests
(``-m server``) with the rest of tests/serve and tests/cli.

The versions expected are those pyproject.toml's classifiers list. ``--require`` (CI) fails at
once, before anything runs, when one of them is not found; otherwise it is reported and skipped.
``--skip 3.11`` leaves out a version whose whole suite ran already (``make test`` in CI); it still
counts as the oldest or newest. Arguments after ``--`` go to every pytest run. Exit status: 0 when
every run passed, 1 when one failed, 2 when an expected version is missing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OLDEST_SUPPORTED = (3, 11)
#: What a version that is neither the oldest nor the newest runs: every real-server test, then
#: the rest of the ``serve`` and CLI tests (two runs that share no test).
SUBSET = (["-m", "server", "tests"], ["-m", "not server", "tests/serve", "tests/cli"])
_PROBE = (
    "import platform, sys, sysconfig; "
    "print(platform.python_implementation(), *sys.version_info[:3], "
    "bool(sysconfig.get_config_var('Py_GIL_DISABLED')))"
)


@dataclass(frozen=True)
class Interpreter:
    minor: tuple[int, int]
    micro: int
    executable: Path

    @property
    def name(self) -> str:
        return f"{self.minor[0]}.{self.minor[1]}"


def main(argv: list[str] | None = None) -> int:
    args, pytest_args = _arguments(sys.argv[1:] if argv is None else argv)
    expected = _classifier_versions()
    found = _find_interpreters()
    missing = [version for version in expected if version not in {i.name for i in found}]
    places = f"{_pyenv_versions()} and PATH"
    for version in missing:
        print(
            f"test-pythons: CPython {version} is in pyproject.toml's classifiers, not in {places}"
        )
    if missing and args.require:
        return 2
    if not found:
        print(f"test-pythons: no CPython 3.11+ found in {places}")
        return 2
    unlisted = [i.name for i in found if i.name not in expected]
    if unlisted:
        print(f"test-pythons: also found {', '.join(unlisted)} (not in the classifiers): run too")
    whole = {found[0].minor, found[-1].minor}
    results: list[tuple[str, str, str, float]] = []
    for interpreter in found:
        scope = "whole suite" if interpreter.minor in whole else "server, serve, CLI"
        if interpreter.name in args.skip:
            results.append((interpreter.name, scope, "skipped (--skip)", 0.0))
            continue
        started = time.monotonic()
        passed = _run(interpreter, interpreter.minor in whole, pytest_args)
        results.append(
            (interpreter.name, scope, "passed" if passed else "FAILED", time.monotonic() - started)
        )
    print("\ntest-pythons:")
    for name, scope, outcome, seconds in results:
        version = next(f"{i.name}.{i.micro}" for i in found if i.name == name)
        print(f"  CPython {version:<8} {scope:<19} {outcome:<17} {seconds / 60:5.1f} min")
    return 1 if any(outcome == "FAILED" for _, _, outcome, _ in results) else 0


def _arguments(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    pytest_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, pytest_args = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(prog="make test-pythons", description=__doc__)
    parser.add_argument("--require", action="store_true", help="fail if a listed one is missing")
    parser.add_argument("--skip", default="", help="versions not to run, such as '3.11'")
    args = parser.parse_args(argv)
    args.skip = set(args.skip.replace(",", " ").split())
    return args, pytest_args


def _classifier_versions() -> list[str]:
    """The ``Programming Language :: Python :: 3.x`` classifiers of pyproject.toml."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        classifiers = tomllib.load(file)["project"]["classifiers"]
    pattern = re.compile(r"Programming Language :: Python :: (3\.\d+)")
    return [match[1] for item in classifiers if (match := pattern.fullmatch(item))]


def _pyenv_versions() -> Path:
    return Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"


def _find_interpreters() -> list[Interpreter]:
    """The newest CPython of each minor version from 3.11 on, oldest minor first."""
    candidates = sorted(_pyenv_versions().glob("3.*/bin/python3"))
    for minor in range(OLDEST_SUPPORTED[1], 30):
        on_path = shutil.which(f"python3.{minor}")
        if on_path is not None:
            candidates.append(Path(on_path))
    newest: dict[tuple[int, int], Interpreter] = {}
    for executable in candidates:
        found = _probe(executable)
        if found is None:
            continue
        if found.minor not in newest or found.micro > newest[found.minor].micro:
            newest[found.minor] = found  # on a tie the first: pyenv's own, before PATH
    return [newest[minor] for minor in sorted(newest)]


def _probe(executable: Path) -> Interpreter | None:
    try:
        answer = subprocess.run(
            [executable, "-c", _PROBE], capture_output=True, text=True, timeout=30, check=True
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    implementation, major, minor, micro, free_threaded = answer
    version = (int(major), int(minor))
    if implementation != "CPython" or version < OLDEST_SUPPORTED or free_threaded == "True":
        return None
    return Interpreter(version, int(micro), executable)


def _run(interpreter: Interpreter, whole: bool, pytest_args: list[str]) -> bool:
    python = _environment(interpreter)
    if python is None:
        return False
    runs = [["tests"]] if whole else list(SUBSET)
    ok = True
    for selection in runs:
        command = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        command += [*selection, *pytest_args]
        print(f"\n== CPython {interpreter.name}.{interpreter.micro}: {' '.join(command[1:])}")
        sys.stdout.flush()
        ok = subprocess.run(command, cwd=ROOT, check=False).returncode == 0 and ok
    return ok


def _environment(interpreter: Interpreter) -> Path | None:
    """``.venv-3.x`` with the project and its dev extra, installed again when pyproject changed."""
    venv = ROOT / f".venv-{interpreter.name}"
    python = venv / "bin" / "python"
    stamp = venv / ".installed-stamp"
    pyproject = ROOT / "pyproject.toml"
    if stamp.exists() and stamp.stat().st_mtime >= pyproject.stat().st_mtime:
        return python
    print(f"\n== CPython {interpreter.name}: installing into {venv.name}")
    steps = [
        [str(interpreter.executable), "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
        [str(python), "-m", "pip", "install", "--quiet", "-e", ".[dev]"],
    ]
    for step in steps:
        if subprocess.run(step, cwd=ROOT, check=False).returncode != 0:
            print(f"test-pythons: {' '.join(step)} failed")
            return None
    stamp.touch()
    return python


if __name__ == "__main__":
    sys.exit(main())
