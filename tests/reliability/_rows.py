"""The rows of docs/servers.md that promise something, as data: how each server is started,
which reload it offers, and what it promises (the user-load matrix, ``test_user_load.py``).

Every row runs the reliability app (``tests/serve/reliability_app.py``: one records file per
worker process) with a runtime whose signal hook is on, a drain deadline of :data:`DEADLINE`
seconds and a stream grace of one second.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["DEADLINE", "RELOADS", "ROWS", "Row"]

#: The drain deadline every row runs with: ``--drain-timeout`` under ``serve``, the runtime's
#: ``signal_drain_timeout`` elsewhere. A never-reading WebSocket holds a drain this long.
DEADLINE: Final = 5.0
#: Reloads of a row that offers one, one after the other under the same load: the second
#: reloads the generation the first one started, as a user's next deploy does.
RELOADS: Final = 2
#: The app every row serves.
APP: Final = "tests.serve.reliability_app:app"
#: The stop's parts past the drain deadline under ``serve`` and a single uvicorn: the first-byte
#: grace (1 s) and the lingering close (2 s).
ONE_LISTENER: Final = 3.0
#: ... and at the final stop of a shared listener: a worker that finds itself the last to accept
#: only once a sibling has emptied the queue (up to 2 s) and closed, then empties it in turn (up
#: to 2 s), before its connections' bound (first-byte grace, lingering close, a second).
SHARED_LISTENER: Final = 8.0
#: gunicorn's keep-alive timeout here: uvicorn's default, above the load's idle expiry (2 s;
#: docs/servers.md, "A proxy or a client pool in front").
GUNICORN_KEEP_ALIVE: Final = 5

Reload = Literal["serve", "sighup"]


@dataclass(frozen=True)
class Row:
    """One way users run the app, and what docs/servers.md promises for it."""

    name: str
    #: The command, ``{port}`` and ``{revision_file}`` filled in by the test.
    command: tuple[str, ...]
    workers: int
    #: How a reload is asked for: ``serve``'s SIGHUP handover (the new generation logs
    #: ``supervisor.handover_done``), a server's own SIGHUP restart, or none.
    reload: Reload | None
    #: Seconds a stop may take past the drain deadline (docs/servers.md, the stop's bound).
    stop_past_deadline: float
    #: Whether every worker takes a share of a burst of connections opened at once.
    spreads_burst: bool = False
    #: Whether the stop at the socket loses nothing (the library's zero-loss stop); where not,
    #: what the server's own stop loses is measured and reported, and only what came before the
    #: signal must be kept.
    zero_loss_stop: bool = True
    #: Whether the server speaks HTTP/2 without TLS (h2c): HTTP/2 clients join the load.
    http2: bool = False
    #: The exit statuses the row's stop ends with (uvicorn 0.29 and later re-raise the signal
    #: once their own stop is done, so a single uvicorn process ends by its SIGTERM).
    exit_codes: frozenset[int] = frozenset({0})


def _gunicorn(worker_class: str) -> tuple[str, ...]:
    return (
        sys.executable, "-m", "gunicorn", APP, "-w", "2", "-k", worker_class,
        "-b", "127.0.0.1:{port}", "--graceful-timeout", "30",
        "--keep-alive", str(GUNICORN_KEEP_ALIVE), "--log-level", "warning",
    )  # fmt: skip


_UVICORN: Final = (
    sys.executable, "-m", "uvicorn", APP, "--host", "127.0.0.1", "--port", "{port}",
    "--log-level", "warning", "--timeout-graceful-shutdown", "30",
)  # fmt: skip
_SERVE: Final = (
    sys.executable, "-m", "forgezero_lifecycle", "serve", APP, "--port", "{port}",
    "--no-access-log", "--drain-timeout", f"{DEADLINE:g}s", "--revision-file", "{revision_file}",
)  # fmt: skip

#: hypercorn's --graceful-timeout here. Its stop waits this long for an HTTP/2 connection that
#: its client keeps open after the GOAWAY (httpx does, with no stream left on it), so it is a
#: part of the row's stop: docs/servers.md says so.
HYPERCORN_GRACEFUL: Final = 5
_HYPERCORN: Final = (
    sys.executable, "-m", "hypercorn", APP, "--bind", "127.0.0.1:{port}",
    "--workers", "0", "--graceful-timeout", str(HYPERCORN_GRACEFUL), "--log-level", "warning",
)  # fmt: skip

ROWS: Final = (
    Row("serve", _SERVE, workers=1, reload=None, stop_past_deadline=ONE_LISTENER),
    Row(
        "serve-workers",
        (*_SERVE, "--workers", "2", "--handover-grace", "1s"),
        workers=2,
        reload="serve",
        stop_past_deadline=ONE_LISTENER,
        spreads_burst=True,
    ),
    Row(
        "uvicorn",
        _UVICORN,
        workers=1,
        reload=None,
        stop_past_deadline=ONE_LISTENER,
        exit_codes=frozenset({0, -signal.SIGTERM}),
    ),
    Row(
        "uvicorn-workers",
        (*_UVICORN, "--workers", "2"),
        workers=2,
        reload="sighup",
        stop_past_deadline=SHARED_LISTENER,
    ),
    Row(
        "gunicorn-ours",
        _gunicorn("forgezero_lifecycle.gunicorn.UvicornWorker"),
        workers=2,
        reload="sighup",
        stop_past_deadline=SHARED_LISTENER,
    ),
    Row(
        "gunicorn-uvicorn-worker",
        _gunicorn("uvicorn_worker.UvicornWorker"),
        workers=2,
        reload="sighup",
        stop_past_deadline=SHARED_LISTENER,
    ),
    Row(
        "hypercorn",
        _HYPERCORN,
        workers=1,
        reload=None,
        # hypercorn's own stop: the hook's drain, then hypercorn closes its connections, and
        # waits its graceful timeout for an HTTP/2 connection its client keeps open.
        stop_past_deadline=2.0 + HYPERCORN_GRACEFUL,
        zero_loss_stop=False,
        http2=True,
    ),
)
