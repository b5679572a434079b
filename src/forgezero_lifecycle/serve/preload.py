"""``serve --workers N --preload``: each generation imports its app once, in a process its
workers are forked from.

Without ``--preload`` every worker process starts Python and imports the app itself: about
0.3 to 0.5 s of CPU for a small Starlette app with this library, paid again by every recycled,
replacement or added worker while its siblings serve on the same two cores. With it, the
generation's *preload process* (``python -m forgezero_lifecycle.serve.preload``, started by the
supervisor before the generation's first worker) imports the app and what each worker would
import as it starts and drains (uvicorn's protocol modules, the drain's own), freezes what the
imports made (:func:`gc.freeze`: a worker's collections then never touch, and so never copy,
those pages) and forks a worker for each request of the supervisor's (:mod:`.forking`, the
supervisor's side). The fork starts where a spawned
worker would be once its import is over (:func:`~forgezero_lifecycle.serve.worker.start`), on
the same listening sockets, tally and private channel, so a forked worker is told, drained,
recycled and stopped exactly as a spawned one. It ends as the interpreter's exit would, without
the teardown (:func:`~forgezero_lifecycle._internals.interpreter.exit_without_teardown`). A SIGHUP's new generation has a preload process
of its own: every generation runs the code on disk when it starts, as without ``--preload``.

What is shared is what a fork shares, as under gunicorn's ``--preload``: what the app's import
opened (a connection pool, a thread, a file) exists once, in the preload process, and each
worker holds a copy of it. An app that opens such things at import should open them in its
lifespan startup instead, which every worker runs.

The preload process's channel is a ``SOCK_SEQPACKET`` socket pair: one JSON message a packet,
and the descriptor a fork needs carried with its request (``SCM_RIGHTS``)::

    supervisor ─▶ {"app": …, "options": …}                    once, first
    preload    ─▶ {"loaded": true} | {"failed": "why"}
    supervisor ─▶ {"fork": 7} + the worker's end of its channel
    preload    ─▶ {"fork": 7, "pid": 4242} + a pidfd of the worker | {"fork": 7, "error": "why"}
    preload    ─▶ {"exited": 4242, "code": 0}                  each worker it reaped

The supervisor signals a forked worker through its pidfd (``pidfd_send_signal``: never another
process that took the pid later) and learns its exit status from the preload process, which
is its parent and reaps it. The preload process dies with the supervisor (its parent-death
signal is SIGKILL: it holds no work); a forked worker then sees the end of its channel, drains
and stops, as a spawned one does. If the preload process alone is gone (killed), its workers
serve on: each one's end is seen on its pidfd, its status unknown, and the generation's next
workers are spawned as without ``--preload``. So is every worker of a generation whose preload
process could not import the app (or not within ``--start-timeout``): the worker's own import
then fails the same way and reports why, as without ``--preload``.

``--preload`` needs Linux 5.3 or later (pidfds); ``serve`` says so at start-up elsewhere.
"""

from __future__ import annotations

import gc
import importlib
import os
import selectors
import signal
import socket
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import orjson

from .._errors import LifecycleError
from .._internals import report
from .._internals.interpreter import exit_without_teardown
from .forking import MAX_PACKET
from .worker import started_by_supervisor

if TYPE_CHECKING:
    from .options import ServeOptions

__all__ = ["main"]

#: Modules a worker imports only once it needs them (its first drain), imported by the preload
#: process instead, each when the module named beside it is loaded (None: always).
_LAZY_MODULES: Final = (
    ("forgezero_lifecycle.wire.accepted", None),
    ("opentelemetry.trace", "forgezero_lifecycle.otel"),
)


def main(argv: Sequence[str] | None = None) -> int:
    """The preload process (see the module docstring); returns its exit code."""
    # As a worker's start, but for the signal the supervisor's end sends: SIGKILL, since it
    # holds no work to drain (a worker forked from it unblocks the commanded signals itself).
    args = started_by_supervisor("forgezero_lifecycle.serve.preload", argv, signal.SIGKILL)
    if args is None or args.tally_fd is None:
        return 1
    report(("interpreter",))  # what its workers' exit relies on, logged once if missing
    for fd in (args.channel_fd, *args.listen_fd, args.tally_fd):
        os.set_inheritable(fd, False)  # forked workers have them; what the app runs does not
    sock = socket.socket(fileno=args.channel_fd)
    config = orjson.loads(sock.recv(MAX_PACKET) or b"null")
    if not isinstance(config, dict):
        return 1  # the supervisor went before it said what to load
    from .options import options_from_wire
    from .server import load_app

    options = options_from_wire(config["options"])
    try:
        preloaded = load_app(config["app"], options)
    except LifecycleError as error:
        sock.send(orjson.dumps({"failed": str(error)}))
        return 2
    _preimport(options)
    gc.freeze()  # what the imports made stays put: no worker's collection writes to it
    sock.send(orjson.dumps({"loaded": True}))
    return _fork_on_request(sock, preloaded, args.listen_fd, args.tally_fd)


def _preimport(options: ServeOptions) -> None:
    """Import here what each worker would import as it starts and as it drains."""
    from .._internals.uvicorn import preimport

    preimport(options.http, options.ws, options.uvicorn.lifespan)
    for module, needs in _LAZY_MODULES:
        if needs is None or needs in sys.modules:
            importlib.import_module(module)


def _fork_on_request(
    sock: socket.socket, preloaded: tuple[Any, ...], listen_fds: list[int], tally_fd: int
) -> int:
    """Fork a worker for each request on ``sock``, and report each one reaped, until the
    supervisor closes the channel."""
    wake_read, wake_write = socket.socketpair()
    wake_write.setblocking(False)
    signal.set_wakeup_fd(wake_write.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup is written
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    own = [selector, sock, wake_read, wake_write]
    while True:
        for key, _ in selector.select():
            if key.fileobj is wake_read:
                wake_read.recv(4096)
                _report_reaped(sock)
                continue
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_PACKET, 1)
            except OSError:
                return 0  # the supervisor is gone
            if not data:
                return 0  # the generation is over
            message = orjson.loads(data)
            if not isinstance(message, dict) or "fork" not in message or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                continue
            _fork(sock, message["fork"], fds[0], own, preloaded, listen_fds, tally_fd)


def _fork(
    sock: socket.socket,
    number: int,
    channel_fd: int,
    own: list[Any],
    preloaded: tuple[Any, ...],
    listen_fds: list[int],
    tally_fd: int,
) -> None:
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError as error:
        os.close(channel_fd)
        sock.send(orjson.dumps({"fork": number, "error": str(error)}))
        return
    if pid == 0:  # the worker
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for thing in own:
                thing.close()
            from .worker import start

            code = start(channel_fd, listen_fds, tally_fd, parent=parent, preloaded=preloaded)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        except BaseException:  # its exit code is its report; nothing else leaves this block
            traceback.print_exc()
        # As the interpreter's own exit (threads joined, atexit handlers run), without its
        # teardown, which would copy every page shared with this process.
        exit_without_teardown(code)
    os.close(channel_fd)
    pidfd = os.pidfd_open(pid)  # its zombie at least: only this process reaps it
    try:
        socket.send_fds(sock, [orjson.dumps({"fork": number, "pid": pid})], [pidfd])
    finally:
        os.close(pidfd)


def _report_reaped(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(orjson.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}))


if __name__ == "__main__":  # pragma: no cover - run by the supervisor
    raise SystemExit(main())
