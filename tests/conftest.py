"""Shared test configuration: every async test runs on asyncio; under pytest-xdist the tests
that send a user's load (marked ``load``) run in :data:`LOAD_SLOTS` lanes of their own
(``--dist loadgroup``; elsewhere at most that many at once, through file locks) and the other
long tests start first. ``FORGEZERO_TEST_CPU=PATH`` appends each test's CPU seconds to PATH (its
own process's, and its reaped subprocesses') and its wall-clock start and end: where the suite's
time goes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

#: Tests marked ``load`` (50 clients and real servers, a few seconds to a minute each) that run
#: at once. Each keeps both cores busy; more at once starve the clients of their own event loop,
#: which then sends late and meets closes a real client would not (the stop's first-byte grace).
LOAD_SLOTS: Final = 2
_SLOTS_DIRECTORY: Final = "FORGEZERO_TEST_LOAD_SLOTS"
#: The file in that folder that maps each load test's node id to its lane.
_LANES: Final = "lanes.json"


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


#: pytest-timeout's default for a test (pyproject.toml); one given more is a long one.
DEFAULT_TIMEOUT: Final = 60


def _runs_long(item: pytest.Item) -> bool:
    """Real-process tests (marked ``server``), tests given more than the default timeout and
    hypothesis searches: a few seconds to a minute each, where most of the others take
    milliseconds."""
    if item.get_closest_marker("server") is not None:
        return True
    timeout = item.get_closest_marker("timeout")
    if timeout is not None and timeout.args and timeout.args[0] > DEFAULT_TIMEOUT:
        return True
    return bool(getattr(getattr(item, "obj", None), "is_hypothesis_test", False)) or (
        item.cls is not None and item.name == "runTest"  # a hypothesis RuleBasedStateMachine
    )


def pytest_configure(config: pytest.Config) -> None:
    """The run's controller (or the only process) makes the load slots' folder; pytest-xdist's
    workers, started after this, inherit its path."""
    if not hasattr(config, "workerinput") and _SLOTS_DIRECTORY not in os.environ:
        os.environ[_SLOTS_DIRECTORY] = tempfile.mkdtemp(prefix="forgezero-load-slots-")
        config.add_cleanup(lambda: shutil.rmtree(os.environ.pop(_SLOTS_DIRECTORY), True))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, hand the long tests out first (the rest, in collection order, fill
    the gaps), so that the last minute of a run is not one long test started late; the ``load``
    tests go first of all, dealt in turn into :data:`LOAD_SLOTS` lanes (:class:`_LoadLanes`)."""
    if not hasattr(config, "workerinput"):  # the order that counts is a worker's collection's
        return
    # Stable: collection order within each kind.
    items.sort(key=lambda item: (item.get_closest_marker("load") is None, not _runs_long(item)))
    loads = [item.nodeid for item in items if item.get_closest_marker("load") is not None]
    lanes = {nodeid: f"load-lane-{number % LOAD_SLOTS}" for number, nodeid in enumerate(loads)}
    # Every worker collects the same tests and writes the same lanes; the controller reads them
    # once all workers have collected.
    directory = Path(os.environ[_SLOTS_DIRECTORY])
    written = directory / f"{_LANES}.{config.workerinput['workerid']}"
    written.write_text(json.dumps(lanes))
    written.replace(directory / _LANES)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, absent under -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadgroup`` (``make test``): the lanes of :class:`_LoadLanes`."""
    if config.getoption("dist") != "loadgroup":
        return None
    return _load_lanes_scheduler()(config, log)


def _load_lanes_scheduler() -> type:
    from xdist.scheduler import LoadScopeScheduling  # only under pytest-xdist

    class _LoadLanes(LoadScopeScheduling):
        """The ``load`` tests in :data:`LOAD_SLOTS` lanes, each lane one process's from the
        start of the run, one test after the other; every other test a unit of its own for
        the other processes. Without lanes, a process whose next test was a load test sat
        waiting for a load slot, and at times most of them did while the other tests queued.

        What ``--dist loadgroup`` does with ``xdist_group`` marks, but pytest-xdist 3.8 groups
        by renaming the item's node id, which pytest 9.2 no longer takes (its ``nodeid`` is
        read from ``_id``), so the lanes come from the workers' collection
        (:func:`pytest_collection_modifyitems`). The lanes, the largest units, are handed out
        first (xdist's loadscope orders units by size)."""

        _lanes: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._lanes is None:
                self._lanes = json.loads((Path(os.environ[_SLOTS_DIRECTORY]) / _LANES).read_text())
            return self._lanes.get(nodeid, nodeid)

    return _LoadLanes


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """The logging configuration as it was before each test. A test that runs ``serve`` or
    uvicorn in-process configures logging with handlers on its capture's stream, closed after
    it; a later test's record would meet that stream ("--- Logging error ---" and a traceback
    in the later test's output: seen under make test-pythons)."""
    manager = logging.Logger.manager
    saved = {
        name: (list(found.handlers), found.level, found.propagate, found.disabled)
        for name, found in [("", logging.getLogger()), *manager.loggerDict.items()]
        if isinstance(found, logging.Logger)
    }
    yield
    for name, found in [("", logging.getLogger()), *manager.loggerDict.items()]:
        if isinstance(found, logging.Logger):
            handlers, level, propagate, disabled = saved.get(
                name, ([], logging.NOTSET, True, False)
            )
            found.handlers = handlers
            found.setLevel(level)
            found.propagate, found.disabled = propagate, disabled


@pytest.fixture(autouse=True)
def _load_untraced(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Under ``make coverage``, a ``load`` test runs without coverage's tracer, in its own
    process (its clients) and in the servers it starts: tracing roughly doubles their CPU, and
    their timing is what such a test judges (a client that lags sends late, as no real client
    of an idle machine would). Every path they take is measured by the tests that send no load."""
    if request.node.get_closest_marker("load") is None:
        yield
        return
    monkeypatch.delenv("COVERAGE_PROCESS_CONFIG", raising=False)
    monkeypatch.delenv("COVERAGE_PROCESS_START", raising=False)
    coverage = sys.modules.get("coverage")  # imported by `coverage run` only
    tracing = coverage.Coverage.current() if coverage is not None else None
    if tracing is None:
        yield
        return
    tracing.stop()
    try:
        yield
    finally:
        tracing.start()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """A ``load`` test waits for a free slot before anything of it runs (outside its timeout);
    with ``FORGEZERO_TEST_CPU`` set, each test's CPU is written (:func:`_cpu_report`)."""
    with contextlib.ExitStack() as stack:
        cpu_report = os.environ.get("FORGEZERO_TEST_CPU")
        if cpu_report:
            stack.enter_context(_cpu_report(Path(cpu_report), item.nodeid))
        if item.get_closest_marker("load") is not None:
            stack.enter_context(_load_slot(Path(os.environ[_SLOTS_DIRECTORY])))
        yield


@contextlib.contextmanager
def _cpu_report(path: Path, nodeid: str) -> Iterator[None]:
    """Append ``CPU-SELF CPU-CHILDREN START END NODEID`` for the test run inside (its reaped
    subprocesses count, with their own reaped children; START and END are wall-clock seconds,
    a load slot's wait included: the run's timeline)."""
    before, started = _cpu_seconds(), time.time()
    yield
    after, ended = _cpu_seconds(), time.time()
    with path.open("a") as out:  # one short append per line: the workers' lines do not mix
        out.write(
            f"{after[0] - before[0]:.3f} {after[1] - before[1]:.3f}"
            f" {started:.3f} {ended:.3f} {nodeid}\n"
        )


@contextlib.contextmanager
def _load_slot(directory: Path) -> Iterator[None]:
    """Hold one of :data:`LOAD_SLOTS` file locks shared by every process of the run."""
    while True:
        for slot in range(LOAD_SLOTS):
            descriptor = os.open(directory / f"slot-{slot}", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(descriptor)
                continue
            try:
                yield
            finally:
                os.close(descriptor)  # releases the lock
            return
        time.sleep(0.05)  # every slot is taken: another process's load test ends soon


def _cpu_seconds() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, reaped.ru_utime + reaped.ru_stime
