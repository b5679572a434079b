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
work the drain still waits for. Once the drain has settled, the stop loses nothing at the socket:
the listener refuses new handshakes and is emptied before it closes (``sockets``), connections
get a first-byte grace instead of an immediate close, and every close lingers
(``connections``).

With ``--workers N`` the process is a supervisor instead: it holds the listening socket and runs
generations of N worker processes that drain as one, and SIGHUP hands over to a new generation
on the same port (README "Several workers").

Modules: ``options`` (flags and values, uvicorn's among them), ``server`` (the ``serve``
command: import the app, find its runtime, serve it under uvicorn with the runtime in control),
``listeners`` (binding, systemd socket activation), ``connections`` and ``sockets`` (the stop
of each connection and of a listener, from :mod:`forgezero_lifecycle.stop`); for
``--workers``: ``machine`` (the supervisor's decisions and its table: states, events, actions,
no I/O), ``supervisor`` (the I/O that carries them out: signals, generations, timers, the
record of each handover, the state transfer, the answers to forwarded control calls),
``workers`` (the supervisor's handle on each worker process, and one generation's workers and
drain), ``channel`` (their private channel and the messages it carries), ``worker`` (the
worker process: its commands, its end of the forwarded control paths, its recycling limits)
and ``preload`` and ``forking`` (``--preload``: the process a generation's workers are forked
from, and the supervisor's side of it).
A SIGHUP runs through ten modules from the signal to the old generation's exit: ``machine``,
``supervisor``, ``workers``, ``channel``, ``options``, ``worker`` and ``server`` here,
``server`` and ``sockets`` of :mod:`forgezero_lifecycle.stop`, and
:mod:`forgezero_lifecycle._internals.uvicorn` (docs/supervisor-states.md, "Reading a handover";
``tests/serve/test_sighup_path.py`` measures it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import attach

# Each name is imported on first use (forgezero_lifecycle._lazy): ``serve.machine``
# imports neither uvicorn nor Starlette (tests/serve/test_machine_alone.py).
if TYPE_CHECKING or not attach(__name__):
    from .options import ServeOptions as ServeOptions
    from .options import add_arguments as add_arguments
    from .options import options_from_args as options_from_args
    from .options import parse_deadline as parse_deadline
    from .options import parse_duration as parse_duration
    from .options import parse_revision as parse_revision
    from .server import find_runtime as find_runtime
    from .server import run as run
    from .server import serve_app as serve_app
