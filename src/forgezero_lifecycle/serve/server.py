"""uvicorn under the runtime's control: SIGTERM turns into a self-drain under one deadline."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import math
import secrets
import signal
import socket
from collections.abc import Iterator, Sequence
from typing import Any, Final, final

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from .._errors import LifecycleError
from ..asgi._types import ASGIApp
from ..runtime import Runtime
from ..wire.drain import DRAIN_PROTOCOL, MAX_DRAIN_TIMEOUT_MS, MIN_DRAIN_TIMEOUT_MS, DrainState
from .options import ServeOptions

__all__ = ["find_runtime", "serve_app"]

logger = logging.getLogger("forgezero_lifecycle.serve")

#: sourceRevision of a self-drain when the runtime does not know its revision.
UNKNOWN_REVISION: Final = "0" * 40
#: uvicorn's own graceful shutdown waits this much longer than the drain deadline.
SHUTDOWN_MARGIN: Final = 5.0


def find_runtime(app: object) -> Runtime | None:
    """The runtime on ``app``: ``runtime.install`` sets ``app.state.forgezero_runtime``,
    ``runtime.wrap`` sets ``forgezero_runtime`` on the middleware it returns."""
    for holder in (getattr(app, "state", None), app):
        runtime = getattr(holder, "forgezero_runtime", None)
        if isinstance(runtime, Runtime):
            return runtime
    return None


async def serve_app(
    app: ASGIApp,
    runtime: Runtime,
    options: ServeOptions,
    *,
    sockets: Sequence[socket.socket] | None = None,
    shared_listener: bool = False,
) -> int:
    """Serve until a signal's self-drain settles (or a second signal forces the stop).

    ``sockets`` are listening sockets to serve on instead of binding ``options.host`` and
    ``options.port`` (inherited from a supervisor or from systemd). ``shared_listener`` says that
    other processes accept on them too: the stop then only stops this process accepting and
    leaves the kernel's listening socket, and its accept queue, to them.
    """
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
        await server.serve(sockets=None if sockets is None else list(sockets))
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
