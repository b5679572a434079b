"""The public surface: each name has one import path, listed in a sorted __all__."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import forgezero_lifecycle
import forgezero_lifecycle.client
import forgezero_lifecycle.errors
import forgezero_lifecycle.jobs
import forgezero_lifecycle.testing
import forgezero_lifecycle.wire
from forgezero_lifecycle._lazy import attach

#: The public import paths: a name is exported by exactly one of them.
PUBLIC = {
    "forgezero_lifecycle": forgezero_lifecycle,
    "forgezero_lifecycle.client": forgezero_lifecycle.client,
    "forgezero_lifecycle.errors": forgezero_lifecycle.errors,
    "forgezero_lifecycle.jobs": forgezero_lifecycle.jobs,
    "forgezero_lifecycle.testing": forgezero_lifecycle.testing,
    "forgezero_lifecycle.wire": forgezero_lifecycle.wire,
}


def _isort_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions.
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def _run(probe: str) -> str:
    """What a fresh interpreter running ``probe`` prints."""
    # Unmeasured: coverage keeps its data in SQLite, so a measured child has sqlite3 loaded.
    env = {k: v for k, v in os.environ.items() if k != "COVERAGE_PROCESS_CONFIG"}
    return subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()


@pytest.mark.parametrize("path", sorted(PUBLIC))
def test_all_is_sorted_and_unique(path: str) -> None:
    """__all__ is kept sorted so additions are reviewed where they belong."""
    names = list(PUBLIC[path].__all__)
    assert names == sorted(names, key=_isort_key)
    assert len(names) == len(set(names))


@pytest.mark.parametrize("path", sorted(PUBLIC))
def test_exported_names_resolve(path: str) -> None:
    """Each name in __all__ is importable from its path (httpx and PostgreSQL lazily)."""
    for name in PUBLIC[path].__all__:
        assert getattr(PUBLIC[path], name) is not None, name


def test_one_import_path_each() -> None:
    """No name is exported by two public paths, so there is one way to import each."""
    homes: dict[str, list[str]] = {}
    for path, module in PUBLIC.items():
        for name in module.__all__:
            homes.setdefault(name, []).append(path)
    assert {name: paths for name, paths in homes.items() if len(paths) > 1} == {}


def test_root_keeps_app_names() -> None:
    """The root is the application's surface: no wire model, path constant or client."""
    assert forgezero_lifecycle.__all__ == [
        "ConfigurationError",
        "ConnectionClosedByDrainError",
        "DrainingError",
        "KeyedQueue",
        "LeaseLostError",
        "LifecycleError",
        "QueueIntakePausedError",
        "Runtime",
        "Scheduler",
        "StateAdapter",
        "StateImportContext",
        "WorkParticipant",
        "__version__",
    ]


def test_one_home_per_error() -> None:
    """The 42 error classes: the handful an application catches on the root, the rest in errors."""
    from forgezero_lifecycle import _errors

    classes = {
        name
        for name, value in vars(_errors).items()
        if inspect.isclass(value) and issubclass(value, _errors.LifecycleError)
    }
    exported = {
        name
        for module in (forgezero_lifecycle, forgezero_lifecycle.errors)
        for name in module.__all__
        if name.endswith("Error")
    }
    assert len(classes) == 43  # DrainingError (background work) and ScaleRefusedError joined
    assert exported == classes


def test_moved_name_warns() -> None:
    """An import of an old root name works and names its one import path."""
    with pytest.warns(DeprecationWarning, match="import DrainStatus from forgezero_lifecycle.wire"):
        moved = forgezero_lifecycle.DrainStatus
    assert moved is forgezero_lifecycle.wire.DrainStatus
    with pytest.warns(DeprecationWarning, match="import JobWorker from forgezero_lifecycle.jobs"):
        assert forgezero_lifecycle.JobWorker is forgezero_lifecycle.jobs.JobWorker
    with pytest.warns(DeprecationWarning, match="from forgezero_lifecycle.jobs"):
        assert forgezero_lifecycle.testing.MemoryJobStore is forgezero_lifecycle.jobs.MemoryJobStore
    assert "DrainStatus" not in dir(forgezero_lifecycle)


def test_public_names_are_all() -> None:
    """No public name sits on the root without being in __all__ (httpx's rule)."""
    public = {
        name
        for name in dir(forgezero_lifecycle)
        if not name.startswith("_") and not inspect.ismodule(getattr(forgezero_lifecycle, name))
    }
    public -= {"annotations", "TYPE_CHECKING", "attach"}
    assert public == set(forgezero_lifecycle.__all__) - {"__version__"}


def test_version_is_installed() -> None:
    """__version__ is what the installed metadata says (pip, the wheel, pyproject.toml)."""
    assert "__version__" in forgezero_lifecycle.__all__
    assert forgezero_lifecycle.__version__ == importlib.metadata.version("forgezero-lifecycle")


def test_root_import_is_lazy() -> None:
    """Each name loads its module on first access: the bare import costs nothing else."""
    probe = (
        "import sys, forgezero_lifecycle; "
        "print(sorted(m for m in sys.modules if m.startswith('forgezero_lifecycle.')))"
    )
    assert _run(probe) == "['forgezero_lifecycle._lazy']"


def test_lazy_name_cached() -> None:
    """After the first access the value is a plain module attribute (no __getattr__ call)."""
    value = forgezero_lifecycle.Runtime
    assert vars(forgezero_lifecycle)["Runtime"] is value
    assert "Runtime" in dir(forgezero_lifecycle)


def test_unknown_name_attr_error() -> None:
    """A typo fails like any missing attribute, naming the module and the name."""
    with pytest.raises(AttributeError, match="'forgezero_lifecycle' has no attribute 'Runtme'"):
        forgezero_lifecycle.Runtme  # noqa: B018 - the attribute access is the test


def _package_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> str:
    """A module named ``fz_lazy_probe`` whose source is ``source``, registered in sys.modules."""
    path = tmp_path / "fz_lazy_probe.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("fz_lazy_probe", path)
    assert spec is not None
    monkeypatch.setitem(sys.modules, "fz_lazy_probe", importlib.util.module_from_spec(spec))
    return "fz_lazy_probe"


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("from .runtime import Runtime\n", "write `Runtime as Runtime`"),
        ("import os\n", "only relative"),
        ("from os import sep as sep\n", "only relative"),
    ],
)
def test_exports_block_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: str, message: str
) -> None:
    """Anything else in the block would be invisible at run time, so it is refused at import."""
    package = _package_from(
        tmp_path, monkeypatch, f"if TYPE_CHECKING or not attach(__name__):\n    {block}"
    )
    with pytest.raises(ImportError, match=message):
        attach(package)


def test_no_exports_block_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing block would export nothing: said at import, not found at first use."""
    package = _package_from(tmp_path, monkeypatch, "from .runtime import Runtime as Runtime\n")
    with pytest.raises(ImportError, match="one `if TYPE_CHECKING or not attach"):
        attach(package)


_BYTECODE_PACKAGE = """
from typing import TYPE_CHECKING

from forgezero_lifecycle._lazy import attach

if TYPE_CHECKING or not attach(__name__):
    from .inner import Thing as Thing
    from .inner import helper as helper
"""


def test_no_source_imports_eagerly(tmp_path: Path) -> None:
    """Bytecode only (a freezer's bundle): the names are imported at once instead of lazily."""
    package = tmp_path / "fz_bytecode_probe"
    package.mkdir()
    (package / "__init__.py").write_text(_BYTECODE_PACKAGE)
    (package / "inner.py").write_text("class Thing: ...\ndef helper(): ...\n")
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-b", str(package)], check=True)
    for source in package.glob("*.py"):
        source.unlink()
    probe = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import fz_bytecode_probe as p; "
        "print(p.__all__, 'fz_bytecode_probe.inner' in sys.modules, p.Thing.__name__)"
    )
    assert _run(probe) == "['Thing', 'helper'] True Thing"


def test_jobs_exports_same_way() -> None:
    """One lazy mechanism: forgezero_lifecycle.jobs lists its names the same way."""
    jobs = forgezero_lifecycle.jobs
    assert jobs.__all__ == sorted(jobs.__all__, key=_isort_key)
    for name in jobs.__all__:
        assert getattr(jobs, name) is not None, name


def test_exports_claim_module() -> None:
    """Classes and functions exported from the root are defined inside the library."""
    for name in forgezero_lifecycle.__all__:
        value = getattr(forgezero_lifecycle, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__.startswith("forgezero_lifecycle"), name


def test_runtime_skips_httpx() -> None:
    """A served generation without a state adapter never pays for httpx (about 5 MiB)."""
    probe = (
        "import sys, forgezero_lifecycle as f; f.Runtime(control_token='t' * 32); "
        "print('httpx' in sys.modules)"
    )
    assert _run(probe) == "False"


def test_runtime_skips_sql_cron() -> None:
    """sqlite3 (about 1 MiB) and cronsim load only when a SQLite store or a cron job is made."""
    probe = (
        "import sys, forgezero_lifecycle as f; f.Runtime(control_token='t' * 32); "
        "print(sorted(m for m in ('sqlite3', 'cronsim', 'psycopg') if m in sys.modules))"
    )
    assert _run(probe) == "[]"


_SERVE_THEN_DRAIN = """
import asyncio, sys
from starlette.applications import Starlette
import forgezero_lifecycle as f
import forgezero_lifecycle.wire as w

runtime = f.Runtime(control_token="t" * 32)
app = Starlette()
runtime.install(app)

async def call(method, path, body=b""):
    sent = []
    scope = {
        "type": "http", "method": method, "path": path, "raw_path": path.encode(),
        "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
        "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
        "headers": [(b"authorization", b"Bearer " + b"t" * 32),
                    (b"content-type", b"application/json")],
    }
    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}
    async def send(message):
        sent.append(message)
    await app(scope, receive, send)
    return sent[0]["status"]

async def main():
    statuses = [await call("GET", w.RUNTIME_READY_PATH), await call("GET", w.RUNTIME_LIVE_PATH)]
    print(statuses, "pydantic" in sys.modules)
    body = (
        b'{"protocol":"forgezero-drain/v1","nonce":"' + b"n" * 43 + b'","sourceRevision":"'
        + b"a" * 40 + b'","targetRevision":"' + b"b" * 40 + b'","timeoutMs":1000}'
    )
    print(await call("POST", w.RUNTIME_DRAIN_BEGIN_PATH, body), "pydantic" in sys.modules)

asyncio.run(main())
"""


def test_pydantic_loaded_late() -> None:
    """Serving, readiness and liveness need no wire model; the first drain request loads them."""
    assert _run(_SERVE_THEN_DRAIN).splitlines() == ["[200, 200] False", "202 True"]


def test_examples_public_imports() -> None:
    """The examples import from the public paths, never from a module inside the library."""
    root = Path(__file__).resolve().parents[1]
    for path in sorted(root.glob("examples/**/*.py")):
        found = re.findall(r"^\s*(?:from|import) (forgezero_lifecycle\S*)", path.read_text(), re.M)
        private = [name for name in found if name not in {*PUBLIC, "forgezero_lifecycle.metrics"}]
        assert private == [], path.relative_to(root)
