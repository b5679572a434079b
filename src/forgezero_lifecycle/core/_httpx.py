"""httpx, imported without its command-line client (what :mod:`._fetch` uses).

httpx's ``__init__`` imports ``httpx._main``, its command-line client, which imports rich and
pygments when they happen to be installed: 3.7 MiB resident and half of httpx's import time
(``bench/memory.py``), for a module a fetch never uses. When this is the first import of httpx,
a ``None`` entry in :data:`sys.modules` makes that one import fail as if rich were absent (httpx
then binds its stub ``main``, see its ``__init__``); the entry is removed right after, so a later
``import httpx._main`` loads the client as usual. The ``httpx`` command runs in a process of its
own and is not affected.
"""

from __future__ import annotations

import functools
import ssl
import sys
from typing import Final

__all__ = ["httpx", "tls_context"]

_CLI: Final = "httpx._main"

if "httpx" in sys.modules or _CLI in sys.modules:
    import httpx
else:
    sys.modules[_CLI] = None  # type: ignore[assignment]  # None blocks an import (importlib docs)
    try:
        import httpx
    finally:
        if _CLI in sys.modules and sys.modules[_CLI] is None:
            del sys.modules[_CLI]


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS context without the environment, built once per process.

    httpx builds one for every client it makes without a transport, loading certifi's CA
    bundle: about 20 ms of CPU each time, paid even by a client that only ever speaks plain HTTP
    to a loopback control plane. :class:`~forgezero_lifecycle.client.ControlClient` passes this
    one instead (``verify=tls_context()``); it has ``trust_env=False``, so what is verified does
    not change. (The handoff fetch has a transport of its own, without TLS.)
    """
    return httpx.create_ssl_context(trust_env=False)
