"""The zero-loss stop of a uvicorn server, shared by every way the library runs one.

``forgezero-lifecycle serve`` (:mod:`forgezero_lifecycle.serve.server`), the gunicorn worker
class (:mod:`forgezero_lifecycle.gunicorn`) and the runtime's signal hook under a uvicorn the
user runs (:mod:`forgezero_lifecycle.core.signal_drain`) all stop the same way. Modules:
``sockets`` (a listener as the kernel sees it: refusing new handshakes, what is still queued,
which processes hold and accept on it) and ``server`` (the stop of each connection, accepting
on a socket sibling processes share one connection a wake-up, and the two put together on a
uvicorn ``Server``). What of uvicorn that relies on is listed in
:mod:`forgezero_lifecycle._internals.uvicorn`.

It sits below ``core`` in the layers (pyproject's import-linter contract): it imports uvicorn
and the standard library only, never the runtime.
"""
