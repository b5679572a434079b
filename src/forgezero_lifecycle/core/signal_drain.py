"""SIGTERM drains under the server the user runs: the first signal begins a self-drain.

``runtime.install(app)`` and then ``uvicorn myapp:app`` (or hypercorn, or gunicorn with the
uvicorn worker): the server has installed its own SIGTERM/SIGINT handler by the time the app's
lifespan starts, and :class:`SignalDrain` wraps it. The first signal begins the runtime's
self-drain (:func:`~forgezero_lifecycle.core.self_drain.self_drain`) while the server keeps
serving; once the drain settles (drained or failed) the server's own handlers are put back and
the signal is handed to them, so the server's own stop begins only then. A second signal goes
straight to the server's own handler: its own stop, at once; and the requests the middleware
still runs are cut (:meth:`SignalDrain.when_forced`), since a server's stop that awaits
``asyncio.Server.wait_closed`` waits until every connection has closed (hypercorn's does so
before its own ``graceful_timeout`` applies), so a request still running would hold it.

Two kinds of server handler are wrapped, as found at install time (in the main thread only):

* a plain ``signal.signal`` handler: uvicorn's ``Server.handle_exit``, which gunicorn's
  ``UvicornWorker`` runs too. Ours replaces it with ``signal.signal``; it only flags the signal
  and schedules the drain on the loop with ``call_soon_threadsafe`` (a signal may arrive between
  any two bytecodes, so nothing else happens in the handler);
* a handler the event loop registered with ``loop.add_signal_handler`` (hypercorn's single-process
  worker, ``--workers 0``). Python's handler is then asyncio's no-op and the callback sits in the
  loop's private table (read by :mod:`forgezero_lifecycle._internals.asyncio`); ours replaces it
  through ``add_signal_handler``. The
  loop dispatches such a handler itself, whatever Python's table holds, so a loop whose table
  cannot be read (uvloop: ``hypercorn -k uvloop``) is left alone and reported unhookable.

Under uvicorn (``uvicorn app:app``, ``uvicorn --workers N``, gunicorn with a uvicorn worker) the
hook also gives the server the zero-loss stop of ``forgezero-lifecycle serve``
(:class:`~forgezero_lifecycle.stop.server.ServerStop`; a uvicorn that lacks what it relies on
keeps its own stop, and says so at startup). At the first signal:

* on a listener this process bound alone, responses under way close after their last byte and
  the drain begins; once it settled, uvicorn's stop refuses new handshakes, takes what the
  listener has queued, gives every connection the first-byte grace and closes lingering;
* on a listener its parent or sibling workers hold too (a restarted or stopped worker), it hands
  over first: it stops accepting at once (the queue stays with the siblings) and answers what
  arrives on its open connections with ``Connection: close``, so keep-alive clients reconnect to
  a sibling; the drain begins, with the rest of the deadline, once every connection that was idle
  has closed or carries a request the app runs (the first-byte grace, longer on a loop that reads
  arrived requests late; at most half the deadline), so nothing that arrived is refused.
  It keeps a descriptor of the listener meanwhile: at the final stop, once no sibling accepts on
  it nor can again, it accepts again and refuses, and its stop empties the queue
  (:meth:`~forgezero_lifecycle.stop.server.ServerStop.hand_over`, the final stop).

A signal that arrives while the server starts (the hook is installed when the app's lifespan
starts, before the app's own startup and before uvicorn serves) begins the server's part and the
drain only once the server serves (at most half the deadline later): a worker of a reload's
new generation stopped during its start-up then hands over like any other, instead of seeing no
listener of its own, draining at once and then accepting with intake closed.

Nothing is hooked when no server handler is installed (the default disposition, or Python's own
``KeyboardInterrupt`` handler for SIGINT, or ``asyncio.run``'s, as under pytest or
``asgi_lifespan.LifespanManager``), nor when the app runs outside the main thread; a warning at
startup then says that SIGTERM stops the process without a drain and that
``forgezero-lifecycle serve`` drains on SIGTERM. A server that takes signals in a parent process
and stops its workers another way (hypercorn's default ``--workers 1``) cannot be hooked either.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, Final, Literal, final

from .._internals import asyncio as _asyncio
from .._internals import report
from .drain import DrainController
from .self_drain import self_drain
from .siblings import shares_listener

if TYPE_CHECKING:
    from ..stop.server import ServerStop

__all__ = ["HOOKED_SIGNALS", "SignalDrain"]

logger = logging.getLogger("forgezero_lifecycle.signals")
#: The loggers the servers configure by default (uvicorn's, which gunicorn's uvicorn workers
#: send to gunicorn's error log, and hypercorn's).
_SERVER_LOGGERS: Final = ("uvicorn.error", "hypercorn.error")

#: The signals that begin a drain.
HOOKED_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
#: Pause between two looks at whether a server that got the signal during its start-up serves.
STARTUP_POLL: Final = 0.02

_State = Literal["idle", "hooked", "unhookable", "done", "disabled"]
_SignalHandler = Callable[[int, FrameType | None], Any]

_UNHOOKABLE: Final = (
    "signal.unhookable: SIGTERM cannot be hooked under this server (%s), so a SIGTERM stops it "
    "without a drain; run the app with `forgezero-lifecycle serve` to drain on SIGTERM"
)
_NO_HANDLER: Final = (
    "no server signal handler in this process; a server that takes signals in a parent "
    "process, such as hypercorn with --workers 1 or more, stops this one without a signal"
)


@final
class SignalDrain:
    """The runtime's signal hook: :meth:`install` at lifespan startup, :meth:`uninstall` after."""

    __slots__ = (
        "_before_stop",
        "_cuts",
        "_drain",
        "_handler",
        "_hooks",
        "_loop",
        "_revision",
        "_server_stop",
        "_signalled",
        "_state",
        "_task",
        "_timeout",
        "pending",
    )

    def __init__(
        self,
        drain: DrainController,
        *,
        revision: str | None,
        timeout: float,
        enabled: bool = True,
        before_stop: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self._drain = drain
        #: Run once the drain settled, before the server's stop (the app's lifespan shutdown).
        self._before_stop = before_stop
        self._revision = revision
        self._timeout = timeout
        self._state: _State = "idle" if enabled else "disabled"
        self._hooks: dict[int, _Hook] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signalled = False
        self._task: asyncio.Task[None] | None = None
        self._handler: _SignalHandler = self._on_signal
        self._server_stop: ServerStop | None = None
        self._cuts: list[Callable[[], None]] = []
        #: True while an install has not been tried yet (the first request tries it then).
        self.pending = enabled

    @property
    def hooked(self) -> tuple[str, ...]:
        """Names of the signals whose server handler is wrapped right now."""
        return tuple(signal.Signals(signum).name for signum in self._hooks)

    @property
    def timeout(self) -> float:
        """The deadline, in seconds, of the drain a signal begins."""
        return self._timeout

    @property
    def zero_loss_stop(self) -> bool:
        """Whether the server's stop is the zero-loss one (a uvicorn whose stop was attached)."""
        return self._server_stop is not None

    def disable(self) -> None:
        """Never hook: for a server that turns signals into a drain itself (``serve``)."""
        self._restore()
        self._state = "disabled"
        self.pending = False

    def when_forced(self, cut: Callable[[], None]) -> None:
        """Call ``cut`` when a second signal hands the server its stop before the drain settled:
        the middleware then cuts the requests it still runs."""
        self._cuts.append(cut)

    def install(self) -> None:
        """Wrap the server's SIGTERM/SIGINT handlers; call on the event loop's thread.

        Tried once per lifespan (a retry after :meth:`uninstall` with ``final=False``).
        """
        if self._state not in ("idle", "done"):
            return
        self.pending = False
        # What is relied on of the server running this process, and of asyncio: logged once
        # where it lacks (the path that needs it falls back).
        report(("asyncio", "uvicorn", "hypercorn"))
        loop = asyncio.get_running_loop()
        if threading.current_thread() is not threading.main_thread():
            self._state = "unhookable"
            logger.warning(_UNHOOKABLE, "the app runs outside the main thread")
            return
        found: dict[int, _Hook] = {}
        reason = _NO_HANDLER
        for signum in HOOKED_SIGNALS:
            hook, why = _find_server_handler(signum, loop, self)
            if hook is not None:
                found[signum] = hook
            elif signum == signal.SIGTERM:
                reason = why
        for hook in found.values():
            hook.install()
        self._hooks = found
        self._loop = loop
        self._signalled = False
        self._state = "hooked" if found else "unhookable"
        if signal.SIGTERM not in found:
            logger.warning(_UNHOOKABLE, reason)
        else:
            self._server_stop = _attach_stop(found[signal.SIGTERM])
            logger.info(
                "signal.hooked signals=%s zero_loss_stop=%s",
                ",".join(self.hooked),
                self.zero_loss_stop,
            )

    def uninstall(self, *, final: bool = True) -> None:
        """Put the server's handlers back; ``final=False`` lets the next request try again."""
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the server stops on its own (a second signal): stop following
        self._task = None
        self._restore()
        if self._state != "disabled":
            self._state = "done" if final else "idle"
            self.pending = not final

    # Signal delivery: first signal → drain; any later one → the server's own handler.

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Runs between two bytecodes of the main thread: flag, forward or schedule, nothing else.
        if self._signalled:
            self._forward(signum, frame)
            return
        self._signalled = True
        if not self._call_soon(self._begin, signum):
            self._forward(signum, frame)  # the loop is gone: the server decides alone

    def _on_loop_signal(self, signum: int) -> None:
        if self._signalled:
            self._forward(signum, None)
            return
        self._signalled = True
        self._begin(signum)

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        hook = self._hooks.get(signum)
        if hook is not None:
            hook.forward(frame)
            self._call_soon(self._forced, signum)

    def _call_soon(self, callback: Callable[[int], None], signum: int) -> bool:
        """Schedule on the loop from a signal handler; False when the loop is closed."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return False
        try:
            loop.call_soon_threadsafe(callback, signum)
        except RuntimeError:  # closed in the meantime
            return False
        return True

    def _forced(self, signum: int) -> None:
        # The server stops on its own now: stop following the drain (it would hand the first
        # signal over a second time) and let every later signal reach the server directly.
        logger.warning(
            "signal.forced signal=%s: handed to the server's own handler before the drain "
            "settled; the requests still running are cut",
            signal.Signals(signum).name,
        )
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None
        self._restore()
        for cut in self._cuts:
            try:
                cut()
            except Exception:  # the server's stop goes on regardless
                logger.exception("signal.cut_failed")

    def _begin(self, signum: int) -> None:
        if signum not in self._hooks:
            return  # put back (or forced) while the signal was on its way: the server stops
        _told().info(
            "signal.drain signal=%s: draining within %.1f s; the server stops once the drain "
            "settles (a second signal stops it now)",
            signal.Signals(signum).name,
            self._timeout,
        )
        stop = self._server_stop
        grace = None if stop is not None and not stop.serving else self._stop_begins()
        self._task = asyncio.get_running_loop().create_task(self._drain_then_stop(signum, grace))

    def _stop_begins(self) -> float:
        """The server's part of a signal's first instant; returns the bound on the handover's
        wait for its connections to move over (0: no handover)."""
        stop = self._server_stop
        if stop is None:
            return 0.0
        stop.shared_listener = not stop.bound_itself or shares_listener(stop.listener_inodes())
        if not stop.shared_listener:
            stop.close_after_responses()
            return 0.0
        stop.hand_over()
        return self._timeout / 2

    async def _server_serving(self) -> float:
        """A signal during the server's start-up (the hook is installed before the app's own
        startup, uvicorn binds its listeners after it): wait until the server serves, at most
        half the deadline, then begin its stop. Begun earlier, it would see no listener of its
        own, drain at once and then accept with intake closed, refusing a reload's clients."""
        stop = self._server_stop
        assert stop is not None
        logger.info("signal.server_starting: the stop begins once the server serves")
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self._timeout / 2
        # Polled: uvicorn sets a plain attribute (Server.started) once it serves.
        while not stop.serving and loop.time() < give_up_at:  # noqa: ASYNC110
            await asyncio.sleep(STARTUP_POLL)
        return self._stop_begins()

    async def _drain_then_stop(self, signum: int, grace: float | None = 0.0) -> None:
        try:
            loop = asyncio.get_running_loop()
            began = loop.time()
            if grace is None:
                grace = await self._server_serving()
            if grace > 0:  # the handover: open connections move to the siblings first
                assert self._server_stop is not None
                from ..stop.server import HANDOVER_GRACE

                # The handover grace at least (keep-alive clients between two requests meet
                # the first-byte grace's close and reconnect to a sibling), then until every
                # connection that was idle has moved.
                await asyncio.sleep(min(HANDOVER_GRACE, grace))
                if not await self._server_stop.wait_moved(grace):
                    logger.warning(
                        "signal.handover_unmoved: connections still idle %.1f s after the "
                        "handover began; the drain closes intake now",
                        grace,
                    )
            state = await self_drain(
                self._drain,
                revision=self._revision,
                timeout=self._timeout - (loop.time() - began),
                log=logger,
                events="signal",
            )
        except Exception:
            logger.exception("signal.drain_crashed: the server stops now")
            state = "failed"
        level = logging.INFO if state == "drained" else logging.WARNING
        _told().log(level, "signal.drain_settled state=%s: the server stops now", state)
        if self._before_stop is not None:
            try:
                await self._before_stop()  # bounded; logs what it could not finish
            except Exception:
                logger.exception("signal.teardown_crashed: the server stops now")
        hook = self._hooks.get(signum)
        self._restore()
        self._task = None
        if hook is not None:
            hook.forward(None)

    def _restore(self) -> None:
        hooks, self._hooks = self._hooks, {}
        for hook in hooks.values():
            hook.restore()


class _Hook:
    """One wrapped server handler: install ours, forward to theirs, put theirs back."""

    def install(self) -> None:
        raise NotImplementedError

    def forward(self, frame: FrameType | None) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError


@final
class _PlainHook(_Hook):
    """A handler installed with ``signal.signal`` (uvicorn, gunicorn's ``UvicornWorker``)."""

    __slots__ = ("_ours", "_server", "_signum")

    def __init__(self, signum: int, server: _SignalHandler, ours: _SignalHandler) -> None:
        self._signum = signum
        self._server = server
        self._ours = ours

    @property
    def server_handler(self) -> _SignalHandler:
        return self._server

    def install(self) -> None:
        signal.signal(self._signum, self._ours)

    def forward(self, frame: FrameType | None) -> None:
        self._server(self._signum, frame)

    def restore(self) -> None:
        if signal.getsignal(self._signum) == self._ours:  # unless someone replaced ours since
            signal.signal(self._signum, self._server)


@final
class _LoopHook(_Hook):
    """A handler registered with ``loop.add_signal_handler`` (hypercorn ``--workers 0``)."""

    __slots__ = ("_args", "_callback", "_loop", "_ours", "_signum")

    def __init__(
        self,
        signum: int,
        loop: asyncio.AbstractEventLoop,
        callback: Callable[..., object],
        args: tuple[object, ...],
        ours: Callable[[int], None],
    ) -> None:
        self._signum = signum
        self._loop = loop
        self._callback = callback
        self._args = args
        self._ours = ours

    def install(self) -> None:
        self._loop.add_signal_handler(self._signum, self._ours, self._signum)

    def forward(self, frame: FrameType | None) -> None:
        self._callback(*self._args)

    def restore(self) -> None:
        if self._loop.is_closed():
            return
        current = _asyncio.loop_signal_handler(self._loop, self._signum)
        if current is not None and current[0] == self._ours:
            self._loop.add_signal_handler(self._signum, self._callback, *self._args)


def _attach_stop(hook: _Hook) -> ServerStop | None:
    """The zero-loss stop of the uvicorn server whose handler ``hook`` wraps, or None (another
    server, or a uvicorn that lacks what the stop relies on: logged)."""
    if not isinstance(hook, _PlainHook) or "uvicorn" not in sys.modules:
        return None  # uvicorn installs its handler with signal.signal; no uvicorn, no server
    from ..stop.server import ServerStop

    return ServerStop.attach(_owner(hook.server_handler))


def _find_server_handler(
    signum: int, loop: asyncio.AbstractEventLoop, owner: SignalDrain
) -> tuple[_Hook | None, str]:
    """The server's handler of ``signum`` as a hook, or None and why it cannot be hooked."""
    current = signal.getsignal(signum)
    if current in (signal.SIG_DFL, signal.SIG_IGN, None, signal.default_int_handler):
        return None, _NO_HANDLER
    if isinstance(_owner(current), asyncio.Runner):
        return None, _NO_HANDLER  # asyncio.run's own SIGINT → KeyboardInterrupt, no server's
    assert callable(current)
    if _belongs_to_a_loop(current):
        # The loop registered the real handler and dispatches it itself (asyncio and uvloop
        # both read the signal off their wakeup fd): only the loop's own table can replace it.
        registered = _asyncio.loop_signal_handler(loop, signum)
        if registered is None:
            return None, "the event loop's signal handler cannot be read"
        callback, args = registered
        return _LoopHook(signum, loop, callback, args, owner._on_loop_signal), ""
    return _PlainHook(signum, current, owner._handler), ""


def _belongs_to_a_loop(handler: object) -> bool:
    """True for what ``loop.add_signal_handler`` leaves in Python's signal table: asyncio's
    module-level no-op, or a method of the loop itself (uvloop's)."""
    if _asyncio.is_signal_noop(handler):
        return True
    return isinstance(_owner(handler), asyncio.AbstractEventLoop)


def _owner(handler: object) -> object:
    """The object a handler is a method of (through ``functools.partial``), or None."""
    if isinstance(handler, functools.partial):
        handler = handler.func
    return getattr(handler, "__self__", None)


def _told() -> logging.Logger:
    """Where a drain's beginning and end are logged: the library's logger, or, while nothing
    handles its records (the library configures no handler, and plain ``uvicorn app:app``
    configures only its own loggers), the server's own log, where its user looks."""
    if logger.hasHandlers():
        return logger
    for name in _SERVER_LOGGERS:
        server = logging.getLogger(name)
        if server.hasHandlers():
            return server
    return logger
