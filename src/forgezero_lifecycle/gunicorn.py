"""A gunicorn worker class whose stop loses nothing on gunicorn's shared listener.

::

    pip install 'forgezero-lifecycle[gunicorn]'
    gunicorn app:app -w 4 -k forgezero_lifecycle.gunicorn.UvicornWorker --graceful-timeout 40

It is uvicorn-worker's ``UvicornWorker`` (same configuration from gunicorn's settings, same
heartbeat) with the zero-loss stop of :mod:`forgezero_lifecycle.stop`: every connection is made
with the zero-loss protocol from the first one, and the worker's shutdown never resets what it
accepted. The kernel socket belongs to gunicorn's arbiter and every worker accepts on it, so a
worker's stop is a handover:

* HUP (gunicorn starts new workers, then sends TERM to the old ones) and TERM: with the app's
  runtime (``runtime.install(app)``), the runtime's signal hook stops this worker accepting at
  once, answers what arrives on its open keep-alive connections with ``Connection: close`` (the
  clients reconnect to a sibling) until each has closed or carries a request the app runs
  (``HANDOVER_GRACE`` on an unloaded machine), then drains within the rest of the runtime's
  ``signal_drain_timeout``; the shutdown that follows closes nothing that still has a request
  coming. Without a runtime the shutdown does the same without the drain;
* QUIT (gunicorn's quick stop) and a second TERM: the shutdown at once, still lingering.

Each worker accepts one connection each time the shared socket wakes it
(:mod:`forgezero_lifecycle.stop.server`), where uvicorn's would take every connection queued:
a burst of connections is shared with the siblings woken by the same readiness. (Without the
per-generation tally ``serve --workers`` keeps, a worker that gets the CPU first under contention
still takes more than its share.)

gunicorn waits ``--graceful-timeout`` seconds for a worker after its final TERM before it kills
it: it must be at least ``HANDOVER_GRACE`` + ``signal_drain_timeout`` + the lingering close
(``LINGER_TIMEOUT``) + a margin, or the arbiter kills a worker that is still draining. The
arbiter's first worker logs a warning at startup when it is smaller. After the drain the worker
sends no heartbeat, so ``--timeout`` must also exceed the stop's last part (a few seconds).

At start-up the worker checks what it relies on of gunicorn, uvicorn-worker and uvicorn
(:mod:`forgezero_lifecycle._internals.gunicorn`, :mod:`forgezero_lifecycle._internals.uvicorn`);
where one lacks something it logs ``gunicorn.zero_loss_unavailable`` with their versions and
runs uvicorn-worker's own worker instead.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import socket
import sys
from typing import Final

from uvicorn_worker import UvicornWorker as _UvicornWorker

from ._internals import gunicorn as _gunicorn
from ._internals import report
from ._internals import uvicorn as _uvicorn
from .serve.server import find_runtime
from .stop.server import (
    FIRST_BYTE_GRACE,
    HANDOVER_GRACE,
    LINGER_TIMEOUT,
    ConnectionStop,
    ZeroLossServer,
    accept_one_at_a_time,
    zero_loss_protocol,
)

__all__ = ["UvicornH11Worker", "UvicornWorker", "required_graceful_timeout"]

logger = logging.getLogger("forgezero_lifecycle.gunicorn")

#: Seconds added to the stop's parts for gunicorn's --graceful-timeout (process exit, logs).
GRACEFUL_MARGIN: Final = 5.0


def required_graceful_timeout(drain_timeout: float) -> int:
    """The least ``--graceful-timeout`` (whole seconds, as gunicorn takes it) under which a
    worker's stop with a drain deadline of ``drain_timeout`` seconds is never killed by the
    arbiter."""
    return math.ceil(HANDOVER_GRACE + drain_timeout + LINGER_TIMEOUT + GRACEFUL_MARGIN)


class UvicornWorker(_UvicornWorker):
    """``gunicorn -k forgezero_lifecycle.gunicorn.UvicornWorker``: the module docstring."""

    def run(self) -> None:
        lacking = _gunicorn.missing() + _uvicorn.missing()
        if lacking:
            logger.warning(
                "gunicorn.zero_loss_unavailable versions=%s missing=%s: uvicorn-worker's own "
                "worker runs, which resets connections still queued or idle at its stop",
                f"{_gunicorn.version()}, uvicorn {_uvicorn.version()}",
                ",".join(lacking),
            )
            super().run()
            return
        report(("asyncio",))
        with asyncio.Runner(loop_factory=self.config.get_loop_factory()) as runner:
            runner.run(self._serve_without_loss())

    async def _serve_without_loss(self) -> None:
        config = self.config
        config.app = self.wsgi
        config.load()
        stop = ConnectionStop(FIRST_BYTE_GRACE)
        config.http_protocol_class = zero_loss_protocol(config.http_protocol_class, stop)
        server = _OneAtATimeServer(config, stop, shared_listener=True)
        self._check_graceful_timeout()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGQUIT, server.handle_exit, signal.SIGQUIT, None)
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(_gunicorn.worker_boot_error())

    def _check_graceful_timeout(self) -> None:
        runtime = find_runtime(self.wsgi)
        if runtime is None:
            logger.info("gunicorn.no_runtime: the stop hands over and lingers, without a drain")
            return
        if self.age > 1:
            return  # said once per arbiter: by its first worker (gunicorn's age counts them)
        needed = required_graceful_timeout(runtime.signal_drain.timeout)
        graceful = float(self.cfg.graceful_timeout)
        if graceful < needed:
            logger.warning(
                "gunicorn.graceful_timeout_too_short graceful_timeout=%g needed=%d: gunicorn "
                "kills a worker still draining; set --graceful-timeout to at least %d (the "
                "handover grace %.1f s + signal_drain_timeout %.1f s + the lingering close)",
                graceful,
                needed,
                needed,
                HANDOVER_GRACE,
                runtime.signal_drain.timeout,
            )


class _OneAtATimeServer(ZeroLossServer):
    """Accepts on gunicorn's sockets one connection a wake-up (:mod:`.stop.server`), so the
    worker woken first does not take a whole burst of connections from its siblings."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=None if sockets is None else [])
        if sockets is not None and self.started:
            accept_one_at_a_time(self, sockets)


class UvicornH11Worker(UvicornWorker):
    """The same worker on uvicorn's pure-Python HTTP implementation (h11)."""

    CONFIG_KWARGS = {"loop": "asyncio", "http": "h11"}  # noqa: RUF012 - uvicorn-worker's shape
