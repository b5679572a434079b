"""``forgezero-lifecycle serve APP``: uvicorn under the runtime's control, SIGTERM turned into a
self-drain under one deadline.

:func:`run` imports the app, finds or builds its runtime (:func:`find_runtime`) and serves it
(:func:`serve_app`). Without ``--workers`` this process serves the app itself; with
``--workers N`` it becomes the supervisor of :mod:`.supervisor`, and every worker process it
starts runs :func:`load_app` anew (so each generation imports the code on disk at its start)
and serves with :func:`serve_app` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, Literal, final

import uvicorn

from .._errors import ConfigurationError
from .._internals import report
from .._internals import uvicorn as _uvicorn
from ..asgi._types import ASGIApp
from ..core.gate import DrainMoment
from ..core.self_drain import self_drain
from ..runtime import Runtime
from ..stop.server import ConnectionStop, ZeroLossServer, cut_connections, zero_loss_protocol
from ..wire.drain import DrainState
from .listeners import own_listeners
from .options import (
    ServeOptions,
    check,
    config_arguments,
    configure_logging,
    load_env_file,
    loop_factory,
)

__all__ = [
    "drain_then_stop",
    "find_runtime",
    "load_app",
    "log_config",
    "run",
    "serve_app",
    "uvicorn_config",
]


logger = logging.getLogger("forgezero_lifecycle.serve")

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
    runtime_source: Literal["app", "serve"] = "app",
    on_server: Callable[[uvicorn.Server], None] | None = None,
    handle_signals: bool = True,
) -> int:
    """Serve until a signal's self-drain settles (or a second signal forces the stop).

    ``sockets`` are listening sockets to serve on instead of binding ``options.host`` and
    ``options.port`` (inherited from a supervisor or from systemd). ``shared_listener`` says that
    other processes accept on them too: the stop then only stops this process accepting and
    leaves the kernel's listening socket, and its accept queue, to them. ``runtime_source`` says
    whether ``runtime`` is the app's own or one ``serve`` built from its flags (for the log).
    ``on_server`` is handed the uvicorn server before it starts (a supervisor's worker watches
    its startup and stops it accepting during a handover). ``handle_signals=False``: SIGTERM
    and SIGINT are the caller's (a supervisor's worker, whose handlers are in place before it
    imports the app).
    """
    stop = ConnectionStop(options.first_byte_grace)
    config = uvicorn_config(app, options)
    server = _Server(config, stop, shared_listener=shared_listener)  # logging is set up now
    _uvicorn.check(server)  # what the stop relies on of uvicorn, before anything starts
    report(("asyncio",))  # what a drain reads of asyncio: logged where it falls back
    config.load()  # the protocol class for --http (auto: httptools when installed), wrapped
    config.http_protocol_class = zero_loss_protocol(config.http_protocol_class, stop)
    runtime.signal_drain.disable()  # the handlers below turn signals into the drain instead
    if on_server is not None:
        on_server(server)
    if runtime_source == "app":
        logger.info("serve.runtime source=app: the app's own runtime, which agrees with the flags")
    else:
        logger.info("serve.runtime source=serve: built from the flags (the app has no runtime)")
    loop = asyncio.get_running_loop()
    logger.info("serve.loop loop=%s.%s", type(loop).__module__, type(loop).__qualname__)
    drain: asyncio.Task[DrainState] | None = None

    def on_signal(signum: int) -> None:
        nonlocal drain
        name = signal.Signals(signum).name
        if drain is None:
            logger.info(
                "serve.signal signal=%s: draining within %.1f s", name, options.drain_timeout
            )
            drain = loop.create_task(drain_then_stop(runtime, options.drain_timeout, server))
        else:
            logger.warning("serve.forced signal=%s: stopping now", name)
            server.force()

    runtime.gate.watch(_close_after_responses(server))
    handled = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
    for signum in handled:
        loop.add_signal_handler(signum, on_signal, signum)
    loop.add_signal_handler(signal.SIGHUP, _ignore_hangup, shared_listener)
    try:
        await server.serve(sockets=None if sockets is None else list(sockets))
    except SystemExit as exit_:  # uvicorn exits when it cannot start (port in use, lifespan)
        logger.error("serve.start_failed code=%s", exit_.code)
        return 1
    finally:
        for signum in (*handled, signal.SIGHUP):
            loop.remove_signal_handler(signum)
    if drain is None:  # stopped by the caller (a supervisor's worker) or before serving
        return 0 if server.started and not runtime.teardown_failed else 1
    if not drain.done():
        drain.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await drain
        return 1
    state = drain.result()
    logger.info("serve.stopped drain=%s teardown_failed=%s", state, runtime.teardown_failed)
    return 0 if state == "drained" and not runtime.teardown_failed else 1


async def drain_then_stop(
    runtime: Runtime, drain_timeout: float, server: uvicorn.Server
) -> DrainState:
    """Drain this generation (or follow a drain already begun), shut the app's lifespan down
    within what is left of the deadline plus the teardown margin, then let uvicorn stop."""
    try:
        state = await self_drain(
            runtime.drain,
            revision=runtime.revision,
            timeout=drain_timeout,
            log=logger,
            events="serve",
        )
        logger.info("serve.drain_settled state=%s", state)
        await runtime.teardown()
    finally:
        server.should_exit = True
    return state


def _ignore_hangup(shared_listener: bool) -> None:
    """SIGHUP to one serving process: logged and ignored (its default action would exit at once,
    cutting every request in flight)."""
    if shared_listener:
        logger.info("serve.sighup_ignored: the supervisor hands over; send SIGHUP to it")
    else:
        logger.warning(
            "serve.sighup_ignored: one process cannot hand over to itself; run "
            "`forgezero-lifecycle serve APP --workers N` to hand over on SIGHUP"
        )


def _close_after_responses(server: uvicorn.Server) -> Callable[[DrainMoment], None]:
    """At each drain's first instant, before anything else runs, close every connection once
    its current response ends (a gate watcher: synchronous, so no response slips through).

    Responses that start during the drain carry ``Connection: close`` (the middleware adds it);
    this covers the ones that started before it, which can no longer carry the header, and the
    requests the middleware does not count (control paths, exempt scopes).
    """

    def at_moment(moment: DrainMoment) -> None:
        if moment != "draining":
            return
        for connection in list(server.server_state.connections):
            cycle = getattr(connection, "cycle", None)
            if cycle is not None and not cycle.response_complete:
                cycle.keep_alive = False

    return at_moment


@final
class _Server(ZeroLossServer):
    """uvicorn with a stop that loses nothing at the socket (:mod:`forgezero_lifecycle.stop`).

    Signals are :func:`serve_app`'s (it installs the handlers); the stop, once the drain has
    settled, is :func:`~forgezero_lifecycle.stop.server.zero_loss_shutdown`.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def force(self) -> None:
        """Stop now: no wait for requests or the lifespan, and every open connection is cut.

        uvicorn's stop ends by awaiting ``asyncio.Server.wait_closed``, which waits until every
        connection has closed (as documented; before Python 3.12.1 it returned at once), so a
        connection left open would hold the forced stop for as long as its request runs.
        """
        self.force_exit = True
        self.should_exit = True
        cut_connections(self)


def uvicorn_config(app: ASGIApp, options: ServeOptions) -> uvicorn.Config:
    """The ``uvicorn.Config`` of one serving process: serve's flags, then uvicorn's own
    (:func:`~.options.config_arguments`: TLS, headers, limits, WebSocket settings)."""
    return uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        http=options.http,
        ws=options.ws,
        root_path=options.root_path,
        log_level=options.log_level,
        log_config=options.uvicorn.log_config or log_config(options.log_level, options.log_label),
        access_log=options.access_log,
        timeout_graceful_shutdown=math.ceil(options.drain_timeout + SHUTDOWN_MARGIN),
        **config_arguments(options.uvicorn),
    )


def log_config(level: str, label: str = "") -> dict[str, Any]:
    """uvicorn's logging config plus the library's loggers on uvicorn's default handler.

    ``label`` ends every line (``worker=0 generation=1`` in a worker of ``serve --workers``):
    each worker and the supervisor log the same events, and a reader must tell them apart.
    """
    config = _uvicorn.logging_config()
    if label:
        for formatter in config["formatters"].values():
            formatter["fmt"] += f" {label}"
    config["loggers"]["forgezero_lifecycle"] = {
        "handlers": ["default"],
        "level": level.upper(),
        "propagate": False,
    }
    return config


# The serve command: import the app, find its runtime, serve it.


#: The graces of a runtime ``serve`` builds when no flag gives them (the ``Runtime`` defaults).
DEFAULT_NOT_READY_GRACE: Final = 0.0
DEFAULT_STREAM_GRACE: Final = 5.0


def run(app: str | ASGIApp, options: ServeOptions) -> int:
    """Import ``app`` (``"module:attribute"``) if needed, serve it, return the exit code.

    One rule (docs/serve.md, "serve's flags and an app's own runtime"): the runtime flags
    configure the runtime ``serve`` serves, and are never silently ignored. They are exported
    first (``FORGEZERO_REVISION``, ``FORGEZERO_NOT_READY_GRACE``, ``FORGEZERO_STREAM_GRACE``);
    an app without a runtime gets one built from them; an app that builds its own reads them
    from the environment (as examples/quickstart/main.py does), and every flag given must agree
    with the runtime it built, or ``serve`` refuses to start.
    """
    flags = options.uvicorn
    if flags.env_file is not None:
        load_env_file(flags.env_file)  # loaded by the CLI already; existing variables win
    check(flags)  # every uvicorn flag, before anything is bound or started
    if options.workers is not None:
        if not isinstance(app, str):
            raise ConfigurationError(detail="--workers needs the app as 'module:attribute'")
        from .supervisor import run_supervisor

        return run_supervisor(app, options)
    configure_logging(flags, log_config(options.log_level, options.log_label))
    # systemd socket activation, --uds or --fd; else uvicorn binds host:port
    given = own_listeners(uds=flags.uds, fd=flags.fd, backlog=flags.backlog)
    sockets = None if not given else [listener.sock for listener in given]
    for listener in given or ():
        logger.info("serve.listening on %s", listener.describe())  # uvicorn says it of its own
    try:
        loaded, runtime, source = load_app(app, options)
        with asyncio.Runner(loop_factory=loop_factory(flags.loop)) as runner:
            return runner.run(
                serve_app(loaded, runtime, options, sockets=sockets, runtime_source=source)
            )
    finally:
        for listener in given or ():
            listener.close()


def load_app(
    app: str | ASGIApp, options: ServeOptions
) -> tuple[ASGIApp, Runtime, Literal["app", "serve"]]:
    """The app (imported when given as a string), its runtime (built from the flags when it has
    none), and where the runtime came from."""
    _export(options)
    if isinstance(app, str):
        app = _import(app, options.app_dir)
    if options.uvicorn.factory:
        app = _call_factory(app)
    runtime = find_runtime(app)
    if runtime is None:
        runtime = Runtime(
            control_token=options.control_token,
            handoff_token=options.handoff_token,
            revision=options.revision,
            not_ready_grace=_or(options.not_ready_grace, DEFAULT_NOT_READY_GRACE),
            stream_grace=_or(options.stream_grace, DEFAULT_STREAM_GRACE),
            insecure_loopback_control=options.insecure_loopback_control,
        )
        return runtime.wrap(app), runtime, "serve"
    _check_agrees(runtime, options)
    return app, runtime, "app"


def _export(options: ServeOptions) -> None:
    if options.revision is not None:
        os.environ["FORGEZERO_REVISION"] = options.revision
    if options.not_ready_grace is not None:
        os.environ["FORGEZERO_NOT_READY_GRACE"] = repr(options.not_ready_grace)
    if options.stream_grace is not None:
        os.environ["FORGEZERO_STREAM_GRACE"] = repr(options.stream_grace)


def _import(target: str, app_dir: str) -> ASGIApp:
    sys.path.insert(0, os.path.abspath(app_dir))
    try:
        app: ASGIApp = _uvicorn.import_from_string(target)
    except _uvicorn.import_error() as error:  # no such module or attribute: uvicorn says which
        raise ConfigurationError(detail=f"cannot import the app {target!r}: {error}") from None
    except Exception as error:
        traceback.print_exc()  # the app's own code failed: its traceback says where
        raise ConfigurationError(
            detail=f"importing the app {target!r} raised {type(error).__name__}: {error}"
        ) from None
    return app


def _call_factory(factory: object) -> ASGIApp:
    """``--factory``: the app is what the factory returns (before serve looks for its runtime)."""
    if not callable(factory):
        raise ConfigurationError(detail="--factory: the app is not callable")
    try:
        app: ASGIApp = factory()
    except Exception as error:
        traceback.print_exc()  # the factory's own code failed: its traceback says where
        raise ConfigurationError(
            detail=f"--factory: calling the app factory raised {type(error).__name__}: {error}"
        ) from None
    return app


def _check_agrees(runtime: Runtime, options: ServeOptions) -> None:
    given = (
        ("--revision", options.revision, runtime.revision),
        ("--not-ready-grace", options.not_ready_grace, runtime.not_ready_grace),
        ("--stream-grace", options.stream_grace, runtime.stream_grace),
    )
    ignored = [
        f"{flag} {value} (the runtime has {actual})"
        for flag, value, actual in given
        if value is not None and value != actual
    ]
    if ignored:
        raise ConfigurationError(
            detail="the app builds its own runtime, which does not use "
            + ", ".join(ignored)
            + ": build it from the settings serve exports (FORGEZERO_REVISION, "
            "FORGEZERO_NOT_READY_GRACE, FORGEZERO_STREAM_GRACE), as the README's Quick start "
            "does, or drop the flags"
        )


def _or(value: float | None, default: float) -> float:
    return default if value is None else value
