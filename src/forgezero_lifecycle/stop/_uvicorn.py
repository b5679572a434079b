"""Everything the zero-loss stop relies on of uvicorn that is not its public API, in one place.

The stop (:mod:`forgezero_lifecycle.stop.server`) and ``forgezero-lifecycle serve`` use:

* ``Server.shutdown(sockets)``: overridden by ``serve`` and the gunicorn worker class, replaced
  on the instance by the runtime's signal hook under a uvicorn the user runs;
* ``Server._wait_tasks_to_complete()``: awaited by the stop, as uvicorn's own shutdown does;
* ``Server.server_state`` (``connections``, ``tasks``), ``Server.servers`` (set by
  ``startup``), ``Server.lifespan`` and ``Server.force_exit``: read by the stop;
* ``Server.startup`` building each connection's protocol from ``config.http_protocol_class`` as
  the connection is made, so a class set on a running server's config serves every later one;
* the HTTP protocol classes (``H11Protocol``, ``HttpToolsProtocol``): ``connection_made``,
  ``data_received``, ``on_response_complete`` and ``shutdown`` (extended), and the instance
  attributes ``transport`` and ``cycle`` (``keep_alive``, ``response_complete``);
* what a ``serve --workers`` worker and the gunicorn worker class need to accept on a shared
  listener their own way (:mod:`.accepting`: once the generation is ready, one connection a
  wake-up): the protocol classes built as ``cls(config=, server_state=, app_state=, _loop=)``,
  as ``Server.startup`` builds them, the lifespan's ``state`` (``LifespanOn``, ``LifespanOff``),
  ``Server.startup(sockets=[])`` starting no listener, and ``Server.servers`` entries used only
  through ``close()``, ``wait_closed()`` and ``sockets``.

:func:`missing` checks them against the installed uvicorn; ``serve`` refuses to start without
them (:func:`check`), the signal hook logs why it leaves uvicorn's own stop in place. Checked
with uvicorn 0.54 and 0.55.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Final

import uvicorn

from .._errors import ConfigurationError

__all__ = ["check", "missing", "version"]

_SERVER_METHODS: Final = ("shutdown", "_wait_tasks_to_complete", "startup", "handle_exit")
_SERVER_ATTRIBUTES: Final = ("server_state", "force_exit", "should_exit")
#: Names ``Server.startup`` must use: the protocol class read per connection, the servers it keeps.
_STARTUP_NAMES: Final = ("http_protocol_class", "servers")
_PROTOCOL_METHODS: Final = ("connection_made", "data_received", "on_response_complete", "shutdown")
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


def version() -> str:
    """The installed uvicorn's version."""
    return str(getattr(uvicorn, "__version__", "unknown"))


def missing(server: uvicorn.Server) -> list[str]:
    """The internals this uvicorn lacks (empty when the stop can be applied); ``server`` is a
    server of it, for the attributes its instances carry."""
    cls = uvicorn.Server
    lacking = [
        f"Server.{name}" for name in _SERVER_METHODS if not callable(getattr(cls, name, None))
    ]
    if "sockets" not in inspect.signature(cls.shutdown).parameters:
        lacking.append("Server.shutdown(sockets)")
    startup = getattr(cls, "startup", None)
    code = getattr(startup, "__code__", None)
    used = set() if code is None else _names(code)
    lacking += [f"Server.startup using {name}" for name in _STARTUP_NAMES if name not in used]
    lacking += [f"Server.{name}" for name in _SERVER_ATTRIBUTES if not hasattr(server, name)]
    state = getattr(server, "server_state", None)
    lacking += [
        f"ServerState.{name}" for name in ("connections", "tasks") if not hasattr(state, name)
    ]
    for module_name, class_name in _PROTOCOL_MODULES:
        try:
            protocol = getattr(importlib.import_module(module_name), class_name)
        except ImportError:  # httptools is optional
            continue
        except AttributeError:
            lacking.append(f"{module_name}.{class_name}")
            continue
        lacking += [
            f"{class_name}.{name}"
            for name in _PROTOCOL_METHODS
            if not callable(getattr(protocol, name, None))
        ]
        parameters = inspect.signature(protocol.__init__).parameters
        lacking += [
            f"{class_name}({name}=)" for name in _PROTOCOL_PARAMETERS if name not in parameters
        ]
    for module_name, class_name in _LIFESPAN_CLASSES:
        lifespan = getattr(importlib.import_module(module_name), class_name, None)
        if lifespan is None or "state" not in _names(lifespan.__init__.__code__):
            lacking.append(f"{class_name}.state")
    return lacking


def check(server: uvicorn.Server) -> None:
    """Raise a configuration error naming uvicorn's version when an internal is missing."""
    lacking = missing(server)
    if lacking:
        raise ConfigurationError(
            detail=f"uvicorn {version()} lacks what the zero-loss stop relies on "
            f"({', '.join(lacking)}); install a uvicorn this library was checked with "
            "(0.54 or 0.55)"
        )


def _names(code: object) -> set[str]:
    """Every name a code object and the functions nested in it refer to."""
    names: set[str] = set(getattr(code, "co_names", ()))
    for constant in getattr(code, "co_consts", ()):
        if inspect.iscode(constant):
            names |= _names(constant)
    return names
