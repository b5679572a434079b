"""The zero-loss stop of a uvicorn server, shared by every way the library runs one.

``forgezero-lifecycle serve`` (:mod:`forgezero_lifecycle.serve.server`), the gunicorn worker
class (:mod:`forgezero_lifecycle.gunicorn`) and the runtime's signal hook under a uvicorn the
user runs (:mod:`forgezero_lifecycle.core.signal_drain`) all stop the same way. Modules:
``sockets`` (the stop of a listener), ``connections`` (the stop of each connection), ``server``
(the two put together on a uvicorn ``Server``), ``accepting`` (accepting on a socket sibling
processes share, one connection a wake-up), ``_uvicorn`` (what of uvicorn that relies on).

It sits below ``core`` in the layers (pyproject's import-linter contract): it imports uvicorn
and the standard library only, never the runtime.
"""
