"""uvicorn under the runtime's control: SIGTERM turns into a self-drain under one deadline."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import math
import signal
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, Literal, final

import uvicorn
from uvicorn.config import HTTP_PROTOCOLS, LOGGING_CONFIG
from uvicorn.importer import import_from_string
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from ..asgi._types import ASGIApp
from ..core.gate import DrainMoment
from ..core.self_drain import self_drain
from ..runtime import Runtime
from ..wire.drain import DrainState
from .connections import ConnectionStop, zero_loss_protocol
from .options import ServeOptions
from .sockets import ListeningSocket, accept_queue_length, refuse_new_connections

__all__ = ["drain_then_stop", "find_runtime", "log_config", "serve_app"]

logger = logging.getLogger("forgezero_lifecycle.serve")

#: uvicorn's own graceful shutdown waits this much longer than the drain deadline.
SHUTDOWN_MARGIN: Final = 5.0
#: Pause between readings of a closing listener's accept queue.
HANDSHAKE_SETTLE: Final = 0.1
#: The longest the stop keeps accepting what is queued before it closes the listener anyway.
ACCEPT_QUEUE_TIMEOUT: Final = 2.0


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
) -> int:
    """Serve until a signal's self-drain settles (or a second signal forces the stop).

    ``sockets`` are listening sockets to serve on instead of binding ``options.host`` and
    ``options.port`` (inherited from a supervisor or from systemd). ``shared_listener`` says that
    other processes accept on them too: the stop then only stops this process accepting and
    leaves the kernel's listening socket, and its accept queue, to them. ``runtime_source`` says
    whether ``runtime`` is the app's own or one ``serve`` built from its flags (for the log).
    ``on_server`` is handed the uvicorn server before it starts (a supervisor's worker watches
    its startup and stops it accepting during a handover).
    """
    stop = ConnectionStop(options.first_byte_grace)
    config = uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        http=zero_loss_protocol(_http_protocol(options.http), stop),
        ws=options.ws,
        root_path=options.root_path,
        log_level=options.log_level,
        log_config=log_config(options.log_level),
        access_log=options.access_log,
        lifespan="auto",
        timeout_graceful_shutdown=math.ceil(options.drain_timeout + SHUTDOWN_MARGIN),
    )
    server = _Server(config, stop, shared_listener=shared_listener)  # logging is set up now
    runtime.signal_drain.disable()  # the handlers below turn signals into the drain instead
    if on_server is not None:
        on_server(server)
    if runtime_source == "app":
        logger.info("serve.runtime source=app: the app's own runtime, which agrees with the flags")
    else:
        logger.info("serve.runtime source=serve: built from the flags (the app has no runtime)")
    loop = asyncio.get_running_loop()
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
            server.force_exit = True
            server.should_exit = True

    runtime.gate.watch(_close_after_responses(server))
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


async def drain_then_stop(
    runtime: Runtime, drain_timeout: float, server: uvicorn.Server
) -> DrainState:
    """Drain this generation (or follow a drain already begun), then let uvicorn stop."""
    try:
        state = await self_drain(
            runtime.drain,
            revision=runtime.revision,
            timeout=drain_timeout,
            log=logger,
            events="serve",
        )
    finally:
        server.should_exit = True
    logger.info("serve.drain_settled state=%s", state)
    return state


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
class _Server(uvicorn.Server):
    """uvicorn with a stop that loses nothing at the socket.

    Signals are :func:`serve_app`'s (it installs the handlers). The stop, once the drain has
    settled:

    1. an own listener refuses new handshakes (``sockets.refuse_new_connections``) and is
       accepted from until its accept queue is empty, then closed; a shared listener (other
       processes accept on it) is only no longer accepted from, and keeps its queue;
    2. every connection gets the first-byte grace or closes after its response
       (``connections.ConnectionStop``), each closed the lingering way;
    3. then uvicorn's own wait for connections and tasks, and the lifespan shutdown.
    """

    def __init__(self, config: uvicorn.Config, stop: ConnectionStop, *, shared_listener: bool):
        super().__init__(config)
        self._stop = stop
        self._shared_listener = shared_listener

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        listeners = [sock for server in self.servers for sock in server.sockets]
        if not self._shared_listener:
            await _take_what_is_queued(listeners)
        for server in self.servers:
            server.close()
        for sock in sockets or ():
            sock.close()
        logger.info(
            "serve.stopping connections=%d first_byte_grace=%.2f",
            len(self.server_state.connections),
            self._stop.first_byte_grace,
        )
        self._stop.begin(self.server_state.connections)
        try:
            await asyncio.wait_for(
                self._wait_tasks_to_complete(), timeout=self.config.timeout_graceful_shutdown
            )
        except TimeoutError:
            logger.error("serve.cancelled tasks=%d", len(self.server_state.tasks))
            for task in self.server_state.tasks:
                task.cancel(msg="the graceful shutdown's timeout is over")
        await self._stop.wait_lingering()
        if not self.force_exit:
            await self.lifespan.shutdown()


async def _take_what_is_queued(listeners: Sequence[ListeningSocket]) -> None:
    """Refuse new handshakes, then let the loop accept until every accept queue is empty."""
    if not all([refuse_new_connections(sock) for sock in listeners]):
        logger.warning(
            "serve.no_syn_filter: this platform cannot refuse new handshakes on a listener; "
            "connections still queued when it closes are reset"
        )
        return
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + ACCEPT_QUEUE_TIMEOUT
    # The kernel offers no notification of an empty accept queue, so it is read after each
    # settle: a handshake under way when the filter was attached completes within one round trip.
    while True:
        await asyncio.sleep(HANDSHAKE_SETTLE)
        queued = sum(accept_queue_length(sock) or 0 for sock in listeners)
        if queued == 0:
            return
        if loop.time() > give_up_at:
            logger.warning("serve.accept_queue_not_empty queued=%d", queued)
            return


def _http_protocol(http: str) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class for ``--http`` (``auto``: httptools when installed)."""
    if http == "auto":
        return AutoHTTPProtocol
    cls: type[asyncio.Protocol] = import_from_string(HTTP_PROTOCOLS[http])
    return cls


def log_config(level: str) -> dict[str, Any]:
    """uvicorn's logging config plus the library's loggers on uvicorn's default handler."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["forgezero_lifecycle"] = {
        "handlers": ["default"],
        "level": level.upper(),
        "propagate": False,
    }
    return config
