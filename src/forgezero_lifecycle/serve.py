"""Run an ASGI app under uvicorn with SIGTERM turned into a self-drain under one deadline.

::

    forgezero-lifecycle serve myapp:app --port 8000 --drain-timeout 30s

The runtime is the one the app carries (``runtime.install(app)`` sets
``app.state.forgezero_runtime``); an app without one is wrapped in a runtime built from the
options. On the first SIGTERM or SIGINT the server keeps running while the runtime drains:
readiness turns 503, after ``not_ready_grace`` new work is refused, admitted work runs to its
end, and then uvicorn shuts down. The exit code is 0 when the drain reached ``drained`` and 1
otherwise. A second signal stops at once (exit 1). If an orchestrator (a preStop hook, say) began
a drain through the control plane already, the signal waits for that drain instead of beginning
another.

uvicorn's ``timeout_graceful_shutdown`` is set above the drain deadline, so uvicorn never cuts
work the drain still waits for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import logging
import math
import os
import re
import secrets
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, final

import uvicorn
from uvicorn.config import LOGGING_CONFIG
from uvicorn.importer import import_from_string

from ._errors import ConfigurationError, LifecycleError
from .asgi._types import ASGIApp
from .runtime import Runtime
from .wire._types import is_revision
from .wire.drain import DRAIN_PROTOCOL, MAX_DRAIN_TIMEOUT_MS, MIN_DRAIN_TIMEOUT_MS, DrainState

__all__ = [
    "ServeOptions",
    "add_arguments",
    "find_runtime",
    "options_from_args",
    "parse_duration",
    "parse_revision",
    "run",
    "serve_app",
]

logger = logging.getLogger("forgezero_lifecycle.serve")

#: sourceRevision of a self-drain when the runtime does not know its revision.
UNKNOWN_REVISION: Final = "0" * 40
#: uvicorn's own graceful shutdown waits this much longer than the drain deadline.
SHUTDOWN_MARGIN: Final = 5.0

_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m)?")
_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}


@final
@dataclass(frozen=True, slots=True)
class ServeOptions:
    """How to serve; the runtime fields apply only to a runtime ``serve`` builds itself."""

    host: str = "127.0.0.1"
    port: int = 8000
    drain_timeout: float = 30.0
    revision: str | None = None
    not_ready_grace: float = 0.0
    stream_grace: float = 5.0
    control_token: str | None = None
    handoff_token: str | None = None
    insecure_loopback_control: bool = False
    http: str = "auto"
    ws: str = "auto"
    root_path: str = ""
    log_level: str = "info"
    access_log: bool = True
    app_dir: str = "."


def parse_duration(text: str) -> float:
    """``30s``, ``500ms``, ``2m`` or plain seconds, as seconds (an argparse ``type``)."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 30s, 500ms or 2m)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_revision(text: str) -> str:
    """A 40-hex revision (an argparse ``type``)."""
    if not is_revision(text):
        raise argparse.ArgumentTypeError(f"not a revision (40 lowercase hex digits): {text!r}")
    return text


EXIT_CODES_HELP: Final = """\
exit codes:
  0  the self-drain after SIGTERM/SIGINT reached drained
  1  it failed or was rolled back, a second signal forced the stop, or the server did not start
  2  usage: bad flags or values, the app cannot be imported

environment:
  FORGEZERO_CONTROL_TOKEN, FORGEZERO_HANDOFF_TOKEN   tokens of a runtime serve builds itself
  FORGEZERO_REVISION, FORGEZERO_NOT_READY_GRACE      set from the flags, for the app to read
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``serve`` command's flags (tokens come from the environment or files)."""
    parser.epilog = EXIT_CODES_HELP
    add = parser.add_argument
    add("app", metavar="APP", help="module:attribute of the ASGI app")
    add("--host", default="127.0.0.1", help="default: 127.0.0.1")
    add("--port", type=int, default=8000, help="default: 8000")
    add("--revision", type=parse_revision, metavar="REV", help="exported as FORGEZERO_REVISION")
    add(
        "--drain-timeout",
        type=parse_duration,
        default=30.0,
        metavar="DURATION",
        help="the self-drain's deadline (default 30s); uvicorn's graceful timeout is above it",
    )
    add(
        "--not-ready-grace",
        type=parse_duration,
        default=0.0,
        metavar="DURATION",
        help="keep admitting this long after readiness turns 503 (default 0s)",
    )
    add(
        "--stream-grace",
        type=parse_duration,
        default=5.0,
        metavar="DURATION",
        help="then WebSockets get 1012 and streams end (default 5s)",
    )
    add("--handoff-token-file", type=Path, metavar="PATH")
    add(
        "--insecure-loopback-control",
        action="store_true",
        help="no control token: admit loopback control clients only (development)",
    )
    add("--http", default="auto", choices=("auto", "h11", "httptools"))
    add("--ws", default="auto")
    add("--root-path", default="")
    add("--log-level", default="info")
    add("--no-access-log", action="store_true")
    add("--app-dir", default=".", help="added to sys.path (default: .)")


def options_from_args(args: argparse.Namespace) -> ServeOptions:
    """Map parsed flags, ``FORGEZERO_CONTROL_TOKEN`` and ``FORGEZERO_HANDOFF_TOKEN`` to options."""
    return ServeOptions(
        host=args.host,
        port=args.port,
        drain_timeout=args.drain_timeout,
        revision=args.revision,
        not_ready_grace=args.not_ready_grace,
        stream_grace=args.stream_grace,
        control_token=_token("FORGEZERO_CONTROL_TOKEN", args.token_file),
        handoff_token=_token("FORGEZERO_HANDOFF_TOKEN", args.handoff_token_file),
        insecure_loopback_control=args.insecure_loopback_control,
        http=args.http,
        ws=args.ws,
        root_path=args.root_path,
        log_level=args.log_level,
        access_log=not args.no_access_log,
        app_dir=args.app_dir,
    )


def _token(env: str, path: Path | None) -> str | None:
    text = os.environ.get(env, "") if path is None else path.read_text()
    return text.strip() or None


def find_runtime(app: object) -> Runtime | None:
    """The runtime on ``app``: ``runtime.install`` sets ``app.state.forgezero_runtime``,
    ``runtime.wrap`` sets ``forgezero_runtime`` on the middleware it returns."""
    for holder in (getattr(app, "state", None), app):
        runtime = getattr(holder, "forgezero_runtime", None)
        if isinstance(runtime, Runtime):
            return runtime
    return None


def run(app: str | ASGIApp, options: ServeOptions) -> int:
    """Import ``app`` (``"module:attribute"``) if needed, serve it, return the exit code.

    ``revision`` and ``not_ready_grace`` are exported as ``FORGEZERO_REVISION`` and
    ``FORGEZERO_NOT_READY_GRACE`` before the import, for apps that build their own runtime.
    """
    if options.revision is not None:
        os.environ["FORGEZERO_REVISION"] = options.revision
    if options.not_ready_grace:
        os.environ["FORGEZERO_NOT_READY_GRACE"] = repr(options.not_ready_grace)
    if isinstance(app, str):
        sys.path.insert(0, os.path.abspath(options.app_dir))
        try:
            app = import_from_string(app)
        except Exception as error:
            raise ConfigurationError(detail=f"cannot import the app {app!r}: {error}") from None
    assert not isinstance(app, str)
    runtime = find_runtime(app)
    if runtime is None:
        runtime = Runtime(
            control_token=options.control_token,
            handoff_token=options.handoff_token,
            revision=options.revision,
            not_ready_grace=options.not_ready_grace,
            stream_grace=options.stream_grace,
            insecure_loopback_control=options.insecure_loopback_control,
        )
        app = runtime.wrap(app)
    elif options.revision is not None and runtime.revision not in (None, options.revision):
        raise ConfigurationError(
            detail="--revision differs from the revision the app's runtime was built with"
        )
    return asyncio.run(serve_app(app, runtime, options))


async def serve_app(app: ASGIApp, runtime: Runtime, options: ServeOptions) -> int:
    """Serve until a signal's self-drain settles (or a second signal forces the stop)."""
    config = uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        http=options.http,
        ws=options.ws,
        root_path=options.root_path,
        log_level=options.log_level,
        log_config=_log_config(options.log_level),
        access_log=options.access_log,
        lifespan="auto",
        timeout_graceful_shutdown=math.ceil(options.drain_timeout + SHUTDOWN_MARGIN),
    )
    server = _Server(config)  # its Config has set up logging: log from here on
    if find_runtime(app) is runtime:
        logger.info("serve.app_runtime: the app's own runtime keeps its own settings")
    loop = asyncio.get_running_loop()
    drain: asyncio.Task[DrainState] | None = None

    def on_signal(signum: int) -> None:
        nonlocal drain
        name = signal.Signals(signum).name
        if drain is None:
            logger.info(
                "serve.signal signal=%s: draining within %.1f s", name, options.drain_timeout
            )
            drain = loop.create_task(_self_drain(runtime, options.drain_timeout, server))
        else:
            logger.warning("serve.forced signal=%s: stopping now", name)
            server.force_exit = True
            server.should_exit = True

    handled = (signal.SIGTERM, signal.SIGINT)
    for signum in handled:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await server.serve()
    except SystemExit as exit_:  # uvicorn exits when it cannot start (port in use, lifespan)
        logger.error("serve.start_failed code=%s", exit_.code)
        return 1
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
    if drain is None:
        return 0 if server.started else 1
    if not drain.done():
        drain.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await drain
        return 1
    state = drain.result()
    logger.info("serve.stopped drain=%s", state)
    return 0 if state == "drained" else 1


async def _self_drain(runtime: Runtime, drain_timeout: float, server: uvicorn.Server) -> DrainState:
    """Drain this generation (or follow a drain already begun), then let uvicorn stop."""
    try:
        if not runtime.drain.active:
            timeout_ms = round(drain_timeout * 1000)
            runtime.drain.begin(
                {
                    "protocol": DRAIN_PROTOCOL,
                    "nonce": secrets.token_urlsafe(32),
                    "sourceRevision": runtime.revision or UNKNOWN_REVISION,
                    "targetRevision": UNKNOWN_REVISION,
                    "timeoutMs": min(MAX_DRAIN_TIMEOUT_MS, max(MIN_DRAIN_TIMEOUT_MS, timeout_ms)),
                }
            )
        else:
            logger.info("serve.following_drain: a drain was already begun")
        state = await runtime.drain.wait()
    except LifecycleError as error:
        logger.error("serve.drain_refused code=%s", error.code)
        state = "failed"
    finally:
        server.should_exit = True
    logger.info("serve.drain_settled state=%s", state)
    return state


@final
class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: :func:`serve_app` installs the handlers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _log_config(level: str) -> dict[str, Any]:
    """uvicorn's logging config plus the library's loggers on uvicorn's default handler."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["forgezero_lifecycle"] = {
        "handlers": ["default"],
        "level": level.upper(),
        "propagate": False,
    }
    return config
