"""The same-port handover (SIGHUP) and the zero-loss stop (SIGTERM) of ``serve --workers 2``
over TLS (``--ssl-certfile``), over a unix socket (``--uds``) and on an inherited socket
(``--fd``), under keep-alive load.

Twenty clients, each on one keep-alive connection, send requests through a handover and then
through the stop. A request is answered (200), refused (503 ``RUNTIME_DRAINING``, or the
connection was refused before anything was sent: the server is gone), or lost: anything else
(a reset, a connection closed without an answer, a TLS error). Nothing may be lost, and the
handover refuses nothing.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import anyio
import httpx
import pytest

from forgezero_lifecycle.core._httpx import tls_context
from tests.certificates import self_signed
from tests.cli.conftest import CONTROL_TOKEN, free_port, popen_logged
from tests.reliability._constants import HANDOFF_TOKEN

from .conftest import Supervised, _stop

pytestmark = [pytest.mark.server, pytest.mark.load, pytest.mark.anyio]

CLIENTS: Final = 20
BOUND: Final = 30.0
#: Below the server's keep-alive timeout (5 s), as for any client pool in front of a server.
KEEPALIVE_EXPIRY: Final = 2.0
REFUSAL: Final = b'{"error":"RUNTIME_DRAINING"}'
_READY = re.compile(
    r"supervisor\.(?:serving|new_generation_ready) generation=(\d+) pids=\[([\d, ]+)\]"
)


@dataclass
class Load:
    """Keep-alive clients sending ``/pid`` (and now and then ``/slow``) until told to stop;
    a refused one waits as the refusal's Retry-After says."""

    client: Callable[[], httpx.AsyncClient]
    answered: int = 0
    refused: int = 0
    lost: list[str] = field(default_factory=list)
    pids: dict[int, int] = field(default_factory=dict)
    stopping: anyio.Event = field(default_factory=anyio.Event)
    #: What the server is doing (named in each loss): serving, handover, serving 2, stop.
    phase: str = "serving"

    async def run(self) -> None:
        async with anyio.create_task_group() as group:
            for number in range(CLIENTS):
                group.start_soon(self._client, number)

    async def _client(self, number: int) -> None:
        async with self.client() as http:
            sent = 0
            while not self.stopping.is_set():
                sent += 1
                path = "/slow?seconds=0.2" if sent % 10 == number % 10 else "/pid"
                try:
                    response = await http.get(path)
                except httpx.ConnectError:
                    self.refused += 1  # nothing was sent: the server is gone
                    await anyio.sleep(0.05)
                    continue
                except httpx.HTTPError as error:
                    self.lost.append(f"{self.phase}: client {number} {path}: {error!r}")
                    continue
                if response.status_code == 200:
                    self.answered += 1
                    pid = response.json()["pid"]
                    self.pids[pid] = self.pids.get(pid, 0) + 1
                elif response.status_code == 503 and response.content == REFUSAL:
                    self.refused += 1
                    # A client that honours Retry-After, as the refusal asks (1 s).
                    await anyio.sleep(float(response.headers["retry-after"]))
                else:
                    self.lost.append(
                        f"{self.phase}: client {number} {path}: {response.status_code}"
                    )
                await anyio.sleep(0.01)


@dataclass(frozen=True)
class Transport:
    """How the supervisor listens and how a client reaches it."""

    flags: tuple[str, ...]
    client: Callable[[], httpx.AsyncClient]
    where: Path | None = None
    #: A listening socket handed to the supervisor (``--fd``), closed here once it has it.
    inherited: socket.socket | None = None


def _limits() -> httpx.Limits:
    return httpx.Limits(
        max_connections=1, max_keepalive_connections=1, keepalive_expiry=KEEPALIVE_EXPIRY
    )


def _tcp_client(port: int) -> Callable[[], httpx.AsyncClient]:
    return lambda: httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}",
        limits=_limits(),
        timeout=BOUND,
        trust_env=False,
        verify=tls_context(),
    )


@pytest.fixture(params=["tls", "tls-uvloop", "uds", "fd"])
def transport(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Transport]:
    """How serve listens: TLS (also on uvloop, ``--loop uvloop``), ``--uds`` or ``--fd``."""
    if request.param.startswith("tls"):
        certificate, key = self_signed(tmp_path)
        context = ssl.create_default_context(cafile=str(certificate))
        port = free_port()
        loop: tuple[str, ...] = ()
        if request.param == "tls-uvloop":
            pytest.importorskip("uvloop")  # uvicorn[standard]'s
            loop = ("--loop", "uvloop")
        yield Transport(
            (
                "--port",
                str(port),
                "--ssl-certfile",
                str(certificate),
                "--ssl-keyfile",
                str(key),
                *loop,
            ),
            lambda: httpx.AsyncClient(
                base_url=f"https://127.0.0.1:{port}",
                verify=context,
                limits=_limits(),
                timeout=BOUND,
                trust_env=False,
            ),
        )
    elif request.param == "uds":
        path = tmp_path / "app.sock"
        yield Transport(
            ("--uds", str(path)),
            lambda: httpx.AsyncClient(
                base_url="http://localhost",
                transport=httpx.AsyncHTTPTransport(uds=str(path), limits=_limits()),
                timeout=BOUND,
                trust_env=False,
            ),
            where=path,
        )
    else:  # a process manager's socket, bound (not listening yet) and passed on
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        with sock:
            yield Transport(
                ("--fd", str(sock.fileno())), _tcp_client(sock.getsockname()[1]), inherited=sock
            )


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Callable[..., Supervised]]:
    """Start ``serve TARGET --workers N FLAGS`` (``workers=0``: plain ``serve``); stopped (and every worker
    checked gone) at the end."""
    started: list[Supervised] = []

    def start(
        *flags: str,
        target: str = "tests.serve.apps:app",
        env: dict[str, str] | None = None,
        inherited: socket.socket | None = None,
        workers: int = 2,
    ) -> Supervised:
        records = tmp_path / f"records-{len(started)}"
        records.mkdir()
        log_path = tmp_path / f"supervisor-{len(started)}.log"
        command = [
            sys.executable, "-m", "forgezero_lifecycle", "serve", target,
            *(("--workers", str(workers)) if workers else ()), "--no-access-log",
            "--handover-grace", "1s", "--drain-timeout", "20s", *flags,
        ]  # fmt: skip
        environment = {
            **os.environ,
            "FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN,
            "FZW_RECORDS": str(records),
            **(env or {}),
        }
        pass_fds = () if inherited is None else (inherited.fileno(),)
        process = popen_logged(command, environment, log_path, pass_fds)
        if inherited is not None:
            inherited.close()  # the supervisor's now: its stop is the last to close it
        served = Supervised("", process, log_path, records)
        started.append(served)
        serving = "supervisor.serving" if workers else "Application startup complete"
        served.wait_for(lambda: serving in served.log() or process.poll() is not None, "serving")
        assert process.poll() is None, f"serve exited {process.returncode}:\n{served.log()}"
        return served

    try:
        yield start
    finally:
        survivors = [pid for served in started for pid in _stop(served)]
        assert survivors == [], f"worker processes survived their supervisor: {survivors}"


async def _until(done: Callable[[], object], what: str, served: Supervised) -> None:
    deadline = time.monotonic() + BOUND
    while not done():
        assert time.monotonic() < deadline, f"not {what} within {BOUND} s:\n{served.log()}"
        await anyio.sleep(0.05)


def _generation_pids(log: str, number: int) -> set[int]:
    for match in _READY.finditer(log):
        if int(match.group(1)) == number:
            return {int(pid) for pid in match.group(2).split(",")}
    return set()


async def test_handover_and_stop_lose_nothing(
    transport: Transport, supervised: Callable[..., Supervised]
) -> None:
    """Through a SIGHUP handover and then a SIGTERM stop under 20 keep-alive clients, over
    TLS, a unix socket or an inherited descriptor: nothing lost, nothing refused by the
    handover, both generations answered, the stop drained (exit 0), and a unix socket's path
    is gone after it."""
    served = supervised(*transport.flags, inherited=transport.inherited)
    load = Load(transport.client)
    async with anyio.create_task_group() as group:
        group.start_soon(load.run)
        first = _generation_pids(served.log(), 1)
        # Answers from generation 1 (how they spread over its two workers is the balance's
        # business, tests/serve/test_burst.py: a starved worker may leave all 20 to its sibling).
        await _until(lambda: load.answered >= 100 and first & set(load.pids), "gen 1", served)
        load.phase = "handover"
        served.signal(signal.SIGHUP)
        await _until(lambda: "supervisor.handover_done" in served.log(), "handed over", served)
        load.phase = "serving 2"
        refused_by_handover = load.refused
        second = _generation_pids(served.log(), 2)
        counted = load.answered
        await _until(
            lambda: second & set(load.pids) and load.answered >= counted + 100, "gen 2", served
        )
        load.phase = "stop"
        served.signal(signal.SIGTERM)
        await _until(lambda: served.process.poll() is not None, "stopped", served)
        load.stopping.set()
    log = served.log()
    assert load.lost == [], f"{len(load.lost)} lost: {load.lost[:5]}\n{log}"
    assert refused_by_handover == 0, log
    assert len(first) == len(second) == 2, log
    assert not first & second, log
    assert served.process.returncode == 0, log
    assert "supervisor.stopped drain=drained exit=0" in log
    loops = re.findall(r"serve\.loop loop=(\w+)\.", log)
    assert len(loops) == 4, log  # two workers in each generation
    assert set(loops) == {"uvloop" if "uvloop" in transport.flags else "asyncio"}
    if transport.where is not None:
        assert not transport.where.exists()


def test_state_is_handed_over_under_tls(
    tmp_path: Path, supervised: Callable[..., Supervised]
) -> None:
    """Under TLS, each new worker still fetches its predecessor's state export from the
    private listener over loopback http: both workers' state is handed over."""
    certificate, key = self_signed(tmp_path)
    served = supervised(
        "--port", str(free_port()), "--ssl-certfile", str(certificate), "--ssl-keyfile", str(key),
        target="tests.serve.reliability_app:app",
        env={
            "FORGEZERO_HANDOFF_TOKEN": HANDOFF_TOKEN,
            "FZREL_RECORDS": str(tmp_path / "{pid}.records"),
        },
    )  # fmt: skip
    served.signal(signal.SIGHUP)
    served.wait_log("supervisor.handover_done")
    log = served.log()
    handed = sorted(re.findall(r"supervisor\.state_handed_over worker=(\d+)", log))
    assert handed == ["0", "1"], log
    assert "state_handoff_failed" not in log


async def test_single_process_stop_loses_nothing(
    transport: Transport, supervised: Callable[..., Supervised]
) -> None:
    """Plain ``serve`` (one process) on the same transports: its own stop at SIGTERM under 20
    keep-alive clients loses nothing, drains (exit 0) and leaves no socket file behind."""
    served = supervised(*transport.flags, inherited=transport.inherited, workers=0)
    load = Load(transport.client)
    async with anyio.create_task_group() as group:
        group.start_soon(load.run)
        await _until(lambda: load.answered >= 200, "answered", served)
        served.signal(signal.SIGTERM)
        await _until(lambda: served.process.poll() is not None, "stopped", served)
        load.stopping.set()
    log = served.log()
    assert load.lost == [], f"{len(load.lost)} lost: {load.lost[:5]}\n{log}"
    assert served.process.returncode == 0, log
    assert "serve.stopped drain=drained" in log
    if transport.where is not None:
        assert not transport.where.exists()


def _cli(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "forgezero_lifecycle", *arguments],
        env={**os.environ, "FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN},
        capture_output=True,
        text=True,
        timeout=BOUND * 2,
        check=False,
    )


@pytest.mark.timeout(120)  # three supervisors, a reload and five CLI processes: 60 s was short
def test_control_commands_reach_serve_on_a_unix_socket_and_tls(
    tmp_path: Path, supervised: Callable[..., Supervised]
) -> None:
    """The CLI reaches a ``serve --uds`` through ``--uds`` (a reload hands over: done) and a
    ``serve`` with TLS of a private CA through ``--cacert`` (ready, status)."""
    path = tmp_path / "app.sock"
    on_socket = supervised("--uds", str(path))
    reload = _cli("reload", "--url", "http://localhost", "--uds", str(path))
    assert reload.returncode == 0, reload.stderr + on_socket.log()
    assert "done" in reload.stdout
    certificate, key = self_signed(tmp_path)
    port = str(free_port())
    supervised("--port", port, "--ssl-certfile", str(certificate), "--ssl-keyfile", str(key))
    url = f"https://127.0.0.1:{port}"
    ready = _cli("ready", "--url", url, "--cacert", str(certificate))
    assert (ready.returncode, ready.stdout.strip()) == (0, "ready"), ready.stderr
    status = _cli("status", "--url", url, "--cacert", str(certificate))
    assert status.returncode == 1, status.stderr  # serving: no drain to show
    assert "RUNTIME_DRAIN_NOT_FOUND" in status.stderr + status.stdout
    untrusted = _cli("ready", "--url", url)
    assert untrusted.returncode == 3, untrusted.stderr  # the system's CAs do not know it


def test_flags_reach_every_worker(supervised: Callable[..., Supervised]) -> None:
    """``--factory``, ``--header``, ``--no-server-header`` and ``--no-date-header`` under
    ``--workers 2``: every worker serves the factory's app with uvicorn's default headers as
    the flags say."""
    port = free_port()
    supervised(
        "--port", str(port), "--factory", "--header", "X-Served-By:forgezero",
        "--no-server-header", "--no-date-header",
        target="tests.serve.apps:create_app",
    )  # fmt: skip
    answers: dict[int, httpx.Headers] = {}
    deadline = time.monotonic() + BOUND
    while len(answers) < 2:  # each request on a new connection: the kernel picks the worker
        assert time.monotonic() < deadline, f"only workers {sorted(answers)} answered"
        response = httpx.get(
            f"http://127.0.0.1:{port}/pid",
            headers={"connection": "close"},
            timeout=BOUND,
            trust_env=False,
            verify=tls_context(),
        )
        assert response.status_code == 200
        answers[response.json()["pid"]] = response.headers
    for headers in answers.values():
        assert headers["x-served-by"] == "forgezero"
        assert "server" not in headers
        assert "date" not in headers
