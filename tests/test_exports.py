"""The package root re-exports the public API, and nothing else, in a sorted __all__."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import forgezero_lifecycle
import forgezero_lifecycle.jobs
from forgezero_lifecycle._lazy import attach


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


def test_all_is_sorted_and_unique() -> None:
    """__all__ is kept sorted so additions are reviewed where they belong."""
    names = forgezero_lifecycle.__all__
    assert names == sorted(names, key=_isort_key)
    assert len(names) == len(set(names))


def test_every_exported_name_resolves() -> None:
    """Each name in __all__ is importable from the root (the client and PostgreSQL lazily)."""
    for name in forgezero_lifecycle.__all__:
        assert getattr(forgezero_lifecycle, name) is not None, name


def test_public_names_are_exactly_all() -> None:
    """No public name sits on the root without being in __all__ (httpx's rule)."""
    public = {
        name
        for name in dir(forgezero_lifecycle)
        if not name.startswith("_") and not inspect.ismodule(getattr(forgezero_lifecycle, name))
    }
    public -= {"annotations", "TYPE_CHECKING", "attach"}
    assert public == set(forgezero_lifecycle.__all__) - {"__version__"}


def test_version_is_the_installed_distributions() -> None:
    """__version__ is what the installed metadata says (pip, the wheel, pyproject.toml)."""
    assert "__version__" in forgezero_lifecycle.__all__
    assert forgezero_lifecycle.__version__ == importlib.metadata.version("forgezero-lifecycle")


def test_importing_the_root_imports_no_module_of_the_library() -> None:
    """Each name loads its module on first access: the bare import costs nothing else."""
    probe = (
        "import sys, forgezero_lifecycle; "
        "print(sorted(m for m in sys.modules if m.startswith('forgezero_lifecycle.')))"
    )
    assert _run(probe) == "['forgezero_lifecycle._lazy']"


def test_a_lazy_name_is_imported_once_then_kept_on_the_module() -> None:
    """After the first access the value is a plain module attribute (no __getattr__ call)."""
    value = forgezero_lifecycle.Runtime
    assert vars(forgezero_lifecycle)["Runtime"] is value
    assert "Runtime" in dir(forgezero_lifecycle)


def test_an_unknown_name_is_an_attribute_error() -> None:
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
def test_the_exports_block_holds_only_explicit_relative_re_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: str, message: str
) -> None:
    """Anything else in the block would be invisible at run time, so it is refused at import."""
    package = _package_from(tmp_path, monkeypatch, f"if TYPE_CHECKING:\n    {block}")
    with pytest.raises(ImportError, match=message):
        attach(package)


def test_a_package_without_an_exports_block_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing block would export nothing: said at import, not found at first use."""
    package = _package_from(tmp_path, monkeypatch, "from .runtime import Runtime as Runtime\n")
    with pytest.raises(ImportError, match="one `if TYPE_CHECKING:` block"):
        attach(package)


def test_a_package_installed_without_its_source_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bytecode only (a freezer's bundle): the exports cannot be read, and the error says why."""
    monkeypatch.setitem(sys.modules, "fz_lazy_probe", types.ModuleType("fz_lazy_probe"))
    with pytest.raises(ImportError, match="read from its source, which is not installed"):
        attach("fz_lazy_probe")


def test_the_jobs_package_exports_through_the_same_helper() -> None:
    """One lazy mechanism: forgezero_lifecycle.jobs lists its names the same way."""
    jobs = forgezero_lifecycle.jobs
    assert jobs.__all__ == sorted(jobs.__all__, key=_isort_key)
    for name in jobs.__all__:
        assert getattr(jobs, name) is not None, name


def test_exported_objects_claim_a_library_module() -> None:
    """Classes and functions exported from the root are defined inside the library."""
    for name in forgezero_lifecycle.__all__:
        value = getattr(forgezero_lifecycle, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__.startswith("forgezero_lifecycle"), name


def test_importing_the_runtime_does_not_import_httpx() -> None:
    """A served generation without a state adapter never pays for httpx (about 5 MiB)."""
    probe = (
        "import sys, forgezero_lifecycle as f; f.Runtime(control_token='t' * 32); "
        "print('httpx' in sys.modules)"
    )
    assert _run(probe) == "False"


def test_importing_the_runtime_loads_no_sql_store_and_no_cron_parser() -> None:
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
    statuses = [await call("GET", f.RUNTIME_READY_PATH), await call("GET", f.RUNTIME_LIVE_PATH)]
    print(statuses, "pydantic" in sys.modules)
    body = (
        b'{"protocol":"forgezero-drain/v1","nonce":"' + b"n" * 43 + b'","sourceRevision":"'
        + b"a" * 40 + b'","targetRevision":"' + b"b" * 40 + b'","timeoutMs":1000}'
    )
    print(await call("POST", f.RUNTIME_DRAIN_BEGIN_PATH, body), "pydantic" in sys.modules)

asyncio.run(main())
"""


def test_the_runtime_loads_pydantic_on_the_first_drain_request_not_before() -> None:
    """Serving, readiness and liveness need no wire model; the first drain request loads them."""
    assert _run(_SERVE_THEN_DRAIN).splitlines() == ["[200, 200] False", "202 True"]


def test_the_examples_import_what_the_readme_shows() -> None:
    """The README imports from the package root; so do the examples, never a module path."""
    root = Path(__file__).resolve().parents[1]
    for path in sorted(root.glob("examples/**/*.py")):
        deep = re.findall(r"^\s*(?:from|import) forgezero_lifecycle\.\S+", path.read_text(), re.M)
        assert deep == [], path.relative_to(root)
