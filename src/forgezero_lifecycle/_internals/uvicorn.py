"""Everything the library relies on of uvicorn beyond its documented API, in one place.

The zero-loss stop (:mod:`forgezero_lifecycle.stop.server`), ``forgezero-lifecycle serve`` and
the gunicorn worker class use:

* ``Server.shutdown(sockets)``: overridden by ``serve`` and the gunicorn worker class, replaced
  on the instance by the runtime's signal hook under a uvicorn the user runs;
* ``Server._wait_tasks_to_complete()``: awaited by the stop, as uvicorn's own shutdown does
  (:func:`wait_tasks_to_complete`);
* ``Server.server_state`` (``connections``, ``tasks``), ``Server.servers`` (set by
  ``startup``), ``Server.lifespan`` (set by ``startup``, with its ``state``),
  ``Server.started``, ``Server.force_exit`` and ``Server.should_exit``: read or set by the
  stop, ``serve`` and its workers;
* ``Server.capture_signals()``: overridden by ``serve`` (it installs its own handlers);
* ``Config.loaded``, ``Config.load()`` and ``Config.http_protocol_class``: the protocol class
  is wrapped once the config is loaded (``Config.get_loop_factory()``, the gunicorn worker's
  event loop as uvicorn-worker's, is the gunicorn worker class's own reliance:
  :mod:`forgezero_lifecycle._internals.gunicorn`; uvicorn before 0.36 lacks it);
* ``Server.startup`` building each connection's protocol from ``config.http_protocol_class`` as
  the connection is made, so a class set on a running server's config serves every later one;
* the HTTP protocol classes (``H11Protocol``, ``HttpToolsProtocol``): ``connection_made`` and
  ``shutdown`` (extended), ``data_received`` and ``on_response_complete`` (extended on the
  instance once the stop begins: read through the instance, as a new cycle's ``on_response``,
  and by the transport, which ``set_protocol`` tells anew), the instance
  attributes ``transport`` and ``cycle``, and their construction as
  ``cls(config=, server_state=, app_state=, _loop=)``, as ``Server.startup`` does it
  (:func:`protocol_factory`: a ``serve --workers`` worker and the gunicorn worker class accept
  their own way, one connection a wake-up, and so does the final stop of a handing-over one);
* ``Server.startup(sockets=[])`` starting no listener, and ``Server.servers`` entries used only
  through ``close()``, ``wait_closed()`` and ``sockets`` (:mod:`forgezero_lifecycle.stop.server`
  adds its own listeners there);
* the lifespan's ``state`` (``LifespanOn``, ``LifespanOff``), and ``LifespanOn``'s
  ``startup_event``, ``shutdown_event`` and ``shutdown()`` where ``Server.serve()`` returned
  without its shutdown (:func:`shutdown_skipped`);
* a request's ``RequestResponseCycle`` (``send.__self__``), acted on by a drain
  (:mod:`forgezero_lifecycle.asgi._uvicorn`): :data:`CYCLE_ATTRIBUTES`, and that ``receive()``
  calls ``flow.resume_reading()`` before it waits;
* a cycle's ``flow`` being its connection's (one ``FlowControl`` per connection), which keeps
  the connection's drain notice as ``forgezero_notice`` (:mod:`forgezero_lifecycle.asgi._notice`);
* the WebSocket protocols' ``transport`` (``send.__self__`` of a session);
* uvicorn's own middleware (:data:`MIDDLEWARE_MODULES`) calling the app it wraps through its
  ``app`` attribute, which the in-flight middleware sets once to its bound ``__call__`` (where
  that does not hold, the middleware is called as an instance, as before);
* ``uvicorn.supervisors.multiprocess.Process.wait_until_ready``: its presence says that
  ``uvicorn --workers`` replaces a worker only once the replacement is ready
  (:func:`reload_waits_for_ready`, read by the final stop of a handing-over worker);
* ``uvicorn.importer.import_from_string`` (``serve APP``) and ``uvicorn.config.LOGGING_CONFIG``
  (``serve``'s log format): :func:`import_from_string`, :func:`logging_config`;
  ``uvicorn.config.create_ssl_context``, which ``serve`` calls once at its start to check the
  ``--ssl-*`` flags before any worker builds its own (:func:`create_ssl_context`);
* ``uvicorn.config.HTTP_PROTOCOLS``, ``WS_PROTOCOLS`` and ``LIFESPAN``, the tables ``Config.load``
  imports its protocol classes by: ``serve --preload`` imports them once, before it forks the
  workers (:func:`preimport`; without them each worker imports its own).

:func:`missing` checks them against the installed uvicorn; ``serve`` refuses to start without
them (:func:`check`), the signal hook and the gunicorn worker class log why they leave
uvicorn's own stop in place. uvicorn is imported only when a function here runs: the lists are
read under every server. Checked with uvicorn 0.54 and 0.55.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import importlib.metadata
import inspect
import socket
import ssl
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from .._errors import ConfigurationError
from .asyncio import code_names

if TYPE_CHECKING:
    import uvicorn

__all__ = [
    "CYCLE_ATTRIBUTES",
    "CYCLE_MODULES",
    "MIDDLEWARE_MODULES",
    "PRIVATE",
    "WEBSOCKET_MODULES",
    "accept_on",
    "check",
    "config_class",
    "create_ssl_context",
    "import_error",
    "import_from_string",
    "logging_config",
    "missing",
    "version",
    "wait_tasks_to_complete",
]

#: The private names of uvicorn this library uses (tests/test_internals.py checks the list):
#: a method called here, and a protocol's constructor argument.
PRIVATE: Final = frozenset({"_wait_tasks_to_complete", "_loop"})

_SERVER_METHODS: Final = (
    "shutdown",
    "_wait_tasks_to_complete",
    "startup",
    "handle_exit",
    "capture_signals",
)
#: Set by ``Server.__init__``.
_SERVER_ATTRIBUTES: Final = ("server_state", "force_exit", "should_exit", "started")
#: Names ``Server.startup`` must use: the protocol class read per connection, the servers it
#: keeps, the lifespan it starts (whose ``state`` each protocol is given).
_STARTUP_NAMES: Final = ("http_protocol_class", "servers", "lifespan")
_CONFIG_METHODS: Final = ("load",)
#: Set by ``Config.__init__`` (``http_protocol_class`` by ``load``).
_CONFIG_ATTRIBUTES: Final = ("loaded",)
_PROTOCOL_METHODS: Final = ("connection_made", "data_received", "on_response_complete", "shutdown")
#: Set on a protocol by its ``__init__``.
_PROTOCOL_ATTRIBUTES: Final = ("transport", "cycle")
#: How ``Server.startup`` builds a connection's protocol (a worker builds its own the same way).
_PROTOCOL_PARAMETERS: Final = ("config", "server_state", "app_state", "_loop")
_LIFESPAN_CLASSES: Final = (
    ("uvicorn.lifespan.on", "LifespanOn"),
    ("uvicorn.lifespan.off", "LifespanOff"),
)
_PROTOCOL_MODULES: Final = (
    ("uvicorn.protocols.http.h11_impl", "H11Protocol"),
    ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol"),
)
#: The modules of uvicorn's HTTP request cycles (``send.__self__`` of a request).
CYCLE_MODULES: Final = frozenset(m for m, _ in _PROTOCOL_MODULES)
#: What a drain reads and sets on a ``RequestResponseCycle`` (set by its ``__init__``).
CYCLE_ATTRIBUTES: Final = (
    "keep_alive",
    "default_headers",
    "response_started",
    "response_complete",
    "disconnected",
    "more_body",
    "message_event",
    "flow",
    "transport",
)
#: uvicorn's own middleware around the app (``ProxyHeadersMiddleware``, on by default, and
#: ``MessageLoggerMiddleware`` at trace level): each calls the app it wraps through its ``app``
#: attribute, which the in-flight middleware sets to its bound ``__call__``
#: (:func:`forgezero_lifecycle.asgi._uvicorn.call_directly`).
MIDDLEWARE_MODULES: Final = frozenset(
    {"uvicorn.middleware.proxy_headers", "uvicorn.middleware.message_logger"}
)
#: uvicorn's WebSocket protocols (``--ws websockets-sansio``, ``websockets``, ``wsproto``): the
#: ``send`` of a session is bound to one, which holds the connection's ``transport``.
WEBSOCKET_MODULES: Final = frozenset(
    {
        "uvicorn.protocols.websockets.websockets_sansio_impl",
        "uvicorn.protocols.websockets.websockets_impl",
        "uvicorn.protocols.websockets.wsproto_impl",
    }
)


def version() -> str:
    """The installed uvicorn's version."""
    try:
        return importlib.metadata.version("uvicorn")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def missing(server: uvicorn.Server | None = None) -> list[str]:
    """The internals this uvicorn lacks (empty when all can be used); ``server``, a server of
    it, is looked at too where given."""
    lacking = list(_classes_missing() if _PRELOADED is None else _PRELOADED)
    if server is not None:
        lacking += [
            f"Server.{name}"
            for name in _SERVER_ATTRIBUTES
            if not hasattr(server, name) and f"Server.{name}" not in lacking
        ]
        state = getattr(server, "server_state", None)
        lacking += [
            f"ServerState.{name}" for name in ("connections", "tasks") if not hasattr(state, name)
        ]
    return lacking


#: What :func:`missing` found in uvicorn's classes, in the process ``serve --preload`` forks
#: workers from (:func:`preimport`): a forked worker has the same classes.
_PRELOADED: tuple[str, ...] | None = None


def _classes_missing() -> tuple[str, ...]:
    """What :func:`missing` finds in uvicorn's classes and modules."""
    import uvicorn

    cls = uvicorn.Server
    lacking = [
        f"Server.{name}" for name in _SERVER_METHODS if not callable(getattr(cls, name, None))
    ]
    if "sockets" not in inspect.signature(cls.shutdown).parameters:
        lacking.append("Server.shutdown(sockets)")
    init = code_names(getattr(cls.__init__, "__code__", None))
    lacking += [f"Server.{name}" for name in _SERVER_ATTRIBUTES if name not in init]
    used = code_names(getattr(getattr(cls, "startup", None), "__code__", None))
    lacking += [f"Server.startup using {name}" for name in _STARTUP_NAMES if name not in used]
    config = uvicorn.Config
    lacking += [
        f"Config.{name}" for name in _CONFIG_METHODS if not callable(getattr(config, name, None))
    ]
    config_init = code_names(config.__init__.__code__)
    lacking += [f"Config.{name}" for name in _CONFIG_ATTRIBUTES if name not in config_init]
    if "http_protocol_class" not in code_names(getattr(config.load, "__code__", None)):
        lacking.append("Config.load setting http_protocol_class")
    for module_name, class_name in _PROTOCOL_MODULES:
        lacking += _protocol_missing(module_name, class_name)
    for module_name, class_name in _LIFESPAN_CLASSES:
        lifespan = getattr(importlib.import_module(module_name), class_name, None)
        if lifespan is None or "state" not in code_names(lifespan.__init__.__code__):
            lacking.append(f"{class_name}.state")
    for module_name in sorted(WEBSOCKET_MODULES):
        module = sys.modules.get(module_name)
        if module is None:  # not in use (importing one may warn of its deprecation)
            continue
        lacking += [
            f"{module_name}.{name}.transport"
            for name, kind in vars(module).items()
            if name.endswith("Protocol")
            and inspect.isclass(kind)
            and kind.__module__ == module_name
            and "transport" not in _code_names_of(getattr(kind, "connection_made", None))
        ]
    try:
        from uvicorn.config import LOGGING_CONFIG
        from uvicorn.importer import import_from_string  # noqa: F401  # there or missing
    except ImportError as error:
        lacking.append(f"uvicorn.{error.name or 'config.LOGGING_CONFIG'}")
    else:
        if not isinstance(LOGGING_CONFIG, dict):
            lacking.append("uvicorn.config.LOGGING_CONFIG")
    return tuple(lacking)


def preimport(http: str, ws: str, lifespan: str) -> None:
    """Import what a server with these protocols imports as it starts (``Config.load``), and
    look at uvicorn's classes (:func:`missing`): done once in the process ``serve --preload``
    forks its workers from, so that no worker pays for it again. uvicorn's tables of protocol
    names (``uvicorn.config.HTTP_PROTOCOLS``, ``WS_PROTOCOLS``, ``LIFESPAN``) are read where
    present; without them each worker imports its own, as a spawned one does."""
    global _PRELOADED
    _PRELOADED = _classes_missing()
    try:
        from uvicorn.config import HTTP_PROTOCOLS, LIFESPAN, WS_PROTOCOLS
        from uvicorn.importer import import_from_string
    except ImportError:
        return
    for table, name in ((HTTP_PROTOCOLS, http), (WS_PROTOCOLS, ws), (LIFESPAN, lifespan)):
        target = table.get(name, name)
        if isinstance(target, str):
            try:
                import_from_string(target)
            except Exception:  # the worker's own import says what is wrong
                return


def _protocol_missing(module_name: str, class_name: str) -> list[str]:
    try:
        module = importlib.import_module(module_name)
    except ImportError:  # httptools is optional
        return []
    protocol = getattr(module, class_name, None)
    if protocol is None:
        return [f"{module_name}.{class_name}"]
    lacking = [
        f"{class_name}.{name}"
        for name in _PROTOCOL_METHODS
        if not callable(getattr(protocol, name, None))
    ]
    parameters = inspect.signature(protocol.__init__).parameters
    lacking += [f"{class_name}({name}=)" for name in _PROTOCOL_PARAMETERS if name not in parameters]
    init = code_names(getattr(protocol.__init__, "__code__", None))
    lacking += [f"{class_name}.{name}" for name in _PROTOCOL_ATTRIBUTES if name not in init]
    cycle = getattr(module, "RequestResponseCycle", None)
    cycle_init = code_names(getattr(getattr(cycle, "__init__", None), "__code__", None))
    lacking += [
        f"{class_name} RequestResponseCycle.{name}"
        for name in CYCLE_ATTRIBUTES
        if name not in cycle_init
    ]
    return lacking


def _code_names_of(function: object) -> set[str]:
    return code_names(getattr(function, "__code__", None))


def check(server: uvicorn.Server) -> None:
    """Raise a configuration error naming uvicorn's version when an internal is missing."""
    lacking = missing(server)
    if lacking:
        raise ConfigurationError(
            detail=f"uvicorn {version()} lacks what the zero-loss stop relies on "
            f"({', '.join(lacking)}); install a uvicorn this library was checked with "
            "(0.54 or 0.55)"
        )


async def wait_tasks_to_complete(server: uvicorn.Server) -> None:
    """uvicorn's own wait, in its shutdown, for every connection to close and every task to
    end."""
    await server._wait_tasks_to_complete()


def protocol_factory(server: uvicorn.Server) -> Callable[[], asyncio.Protocol]:
    """What a started ``server``'s ``Server.startup`` builds for each connection: its
    ``config.http_protocol_class`` as ``cls(config=, server_state=, app_state=, _loop=)``."""
    config = server.config
    state, app_state = server.server_state, server.lifespan.state

    def protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
        made: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=state, app_state=app_state, _loop=_loop
        )
        return made

    return protocol


async def accept_on(
    server: uvicorn.Server, sockets: list[socket.socket], *, tls: bool = True
) -> None:
    """Have a started ``server`` accept on ``sockets`` too, the way its ``Server.startup``
    does (:func:`protocol_factory`); each listener joins ``server.servers`` (which uvicorn's
    shutdown closes). ``tls=False``: plain connections even where the server's are TLS."""
    config = server.config
    loop = asyncio.get_running_loop()
    for sock in sockets:
        listening = await loop.create_server(
            protocol_factory(server),
            sock=sock,
            ssl=config.ssl if tls else None,
            backlog=config.backlog,
        )
        server.servers.append(listening)


def shutdown_skipped(server: uvicorn.Server) -> bool:
    """Whether ``server.serve()`` returned with its app's lifespan started and never shut down:
    a uvicorn told to exit during its startup (0.30 among others) returns at once, without its
    shutdown; a later one shuts down all the same. False where it cannot be told (no
    ``LifespanOn``)."""
    lifespan = getattr(server, "lifespan", None)
    began = getattr(lifespan, "startup_event", None)
    ended = getattr(lifespan, "shutdown_event", None)
    if not isinstance(began, asyncio.Event) or not isinstance(ended, asyncio.Event):
        return False
    failed = bool(getattr(lifespan, "startup_failed", False))
    return bool(server.started) and began.is_set() and not ended.is_set() and not failed


def reload_waits_for_ready() -> bool:
    """Whether ``uvicorn --workers``' SIGHUP starts each new worker and waits until it is ready
    before it stops the old one (``Process.wait_until_ready``: uvicorn 0.55 has it, 0.30 does
    not); before, it stopped the old worker first, so a stopped worker with no sibling accepting
    may be a reload's as well as the final stop's."""
    from uvicorn.supervisors import multiprocess

    return callable(getattr(multiprocess.Process, "wait_until_ready", None))


def import_from_string(target: str) -> Any:
    """uvicorn's ``module:attribute`` import (``uvicorn.importer``), as ``uvicorn APP`` reads
    its argument; raises uvicorn's ``ImportFromStringError``."""
    from uvicorn.importer import import_from_string as imported

    return imported(target)


def import_error() -> type[Exception]:
    """uvicorn's ``ImportFromStringError``."""
    from uvicorn.importer import ImportFromStringError

    return ImportFromStringError


def logging_config() -> dict[str, Any]:
    """A copy of uvicorn's default logging configuration (``uvicorn.config.LOGGING_CONFIG``)."""
    from uvicorn.config import LOGGING_CONFIG

    return copy.deepcopy(LOGGING_CONFIG)


def config_class() -> type[uvicorn.Config]:
    """``uvicorn.Config`` (its parameters say which flags this uvicorn has)."""
    import uvicorn

    return uvicorn.Config


def create_ssl_context(**arguments: Any) -> ssl.SSLContext:
    """uvicorn's own TLS context for ``--ssl-*`` (``uvicorn.config.create_ssl_context``)."""
    from uvicorn.config import create_ssl_context as created

    context: ssl.SSLContext = created(**arguments)
    return context
