"""Everything the library relies on of hypercorn beyond its documented API, in one place.

A drain acts on hypercorn's own HTTP/1 streams of its asyncio worker
(:mod:`forgezero_lifecycle.asgi._hypercorn`), and tells HTTP/2 clients with GOAWAY:

* ``HTTPStream`` (``send.__self__`` of a request): :data:`STREAM_ATTRIBUTES`, ``app_send``,
  its ``state`` an ``ASGIHTTPState`` with ``REQUEST`` and ``RESPONSE``, its ``response``;
  ``app_put`` the ``put`` of the ``asyncio.Queue`` the app's ``receive`` reads;
* the ``H11Protocol`` behind a stream's ``send`` (``stream_send``), with its ``connection``
  (h11's, for ``their_state``) and ``send``: the asyncio ``TCPServer``'s, with its ``writer``;
* a ``WSStream`` (``send.__self__`` of a WebSocket session) and its ``send``, the same way;
* the ``H2Protocol`` behind an HTTP/2 stream's ``send``: ``connection`` (h2's
  ``H2Connection``, for ``highest_inbound_stream_id``, and ``reset_stream`` and
  ``data_to_send`` to reset a stream the drain cut), ``streams``, ``stream_buffers`` (a
  stream's last frames not yet written), ``closed`` and ``send``;
  the stream's ``stream_id``; and hyperframe, which hypercorn's HTTP/2 brings.

No underscore attribute of hypercorn's is used. :func:`missing` checks the classes at start-up;
each request's stream is looked at once per class too (the instance attributes), and a stream
without them is served by the wrapped path. hypercorn is imported only when :func:`missing`
runs. Checked with hypercorn 0.17 and 0.18.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Final

from .asyncio import code_names

__all__ = [
    "H11_BODY_IN",
    "PRIVATE",
    "STREAM_ATTRIBUTES",
    "STREAM_MODULES",
    "WS_STREAM_MODULE",
    "missing",
    "version",
]

#: The private names of hypercorn this library uses: none.
PRIVATE: Final[frozenset[str]] = frozenset()
#: The module of hypercorn's HTTP stream (``send.__self__`` of a request).
STREAM_MODULES: Final = frozenset({"hypercorn.protocol.http_stream"})
WS_STREAM_MODULE: Final = "hypercorn.protocol.ws_stream"
#: What a drain reads and sets on a stream (instance attributes).
STREAM_ATTRIBUTES: Final = ("state", "closed", "send", "app_put", "app_send", "scope")
#: The names of h11's states of the client's side once its whole request (body included) is
#: in. Names, not h11's objects: read under every server, h11 is not imported.
H11_BODY_IN: Final = frozenset({"DONE", "MUST_CLOSE", "CLOSED"})

#: (module, class, names its code must use, methods it must have).
_CLASSES: Final = (
    (
        "hypercorn.protocol.http_stream",
        "HTTPStream",
        ("state", "closed", "send", "app_put", "scope", "response"),
        ("app_send",),
    ),
    ("hypercorn.protocol.h11", "H11Protocol", ("connection", "send", "stream_send"), ()),
    ("hypercorn.protocol.ws_stream", "WSStream", ("send",), ("app_send",)),
    (
        "hypercorn.protocol.h2",
        "H2Protocol",
        ("connection", "streams", "stream_buffers", "closed", "send"),
        (),
    ),
    ("hypercorn.asyncio.tcp_server", "TCPServer", ("writer",), ("protocol_send",)),
)


def version() -> str:
    """The installed hypercorn's version."""
    try:
        return importlib.metadata.version("hypercorn")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def missing() -> list[str]:
    """The internals this hypercorn lacks (its classes; the instances are looked at per class
    of stream as requests come)."""
    lacking: list[str] = []
    for module_name, class_name, names, methods in _CLASSES:
        try:
            kind = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            lacking.append(f"{module_name}.{class_name}")
            continue
        used: set[str] = set()
        for member in vars(kind).values():
            used |= code_names(getattr(member, "__code__", None))
        lacking += [f"{class_name}.{name}" for name in names if name not in used]
        lacking += [
            f"{class_name}.{name}()" for name in methods if not callable(getattr(kind, name, None))
        ]
    try:
        state = importlib.import_module("hypercorn.protocol.http_stream").ASGIHTTPState
    except (ImportError, AttributeError):
        lacking.append("ASGIHTTPState")
    else:
        if not {"REQUEST", "RESPONSE"} <= set(getattr(state, "__members__", ())):
            lacking.append("ASGIHTTPState.REQUEST,RESPONSE")
    return lacking
