"""The supervisor's side of ``serve --workers N --preload``: a generation's preload process
(:mod:`.preload`, which says what it does and how the two sides talk) and the workers it forks.

:class:`PreloadProcess` starts the preload process and asks it for workers; :class:`ForkedProcess`
is a forked worker as :class:`~.workers.WorkerHandle` drives it, with what it uses of
:class:`asyncio.subprocess.Process`. The preload process imports what serves the app
(:mod:`.server`, :mod:`.worker`); this side imports neither, so the supervisor's modules point
down (``pyproject.toml``'s import contracts).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any, Final, final

import orjson

__all__ = ["MAX_PACKET", "ForkedProcess", "PreloadProcess", "available"]

logger = logging.getLogger("forgezero_lifecycle.serve.supervisor")

#: The largest message either side sends (the generation's options are the largest).
MAX_PACKET: Final = 256 * 1024
#: How long the supervisor waits for the preload process to exit once told to, then kills it.
CLOSE_BOUND: Final = 5.0


def available() -> str | None:
    """None when ``--preload`` can run here, else why not (for the start-up error)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open"):
        return "--preload needs Linux (pidfds)"
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError as error:
        return f"--preload needs pidfds (Linux 5.3 or later): {error.strerror or error}"
    return None


@final
class ForkedProcess:
    """A worker forked by a preload process, as the supervisor handles it: what the supervisor
    uses of :class:`asyncio.subprocess.Process` (``pid``, ``wait``, ``send_signal``), and
    :attr:`running` in place of ``returncode is None`` (its status may never be known)."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self._pidfd = pidfd
        #: The exit status (negative: the signal that killed it); None while it runs, and after
        #: it exited if its status is unknown (its preload process was gone).
        self.returncode: int | None = None
        self._exited: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

    @property
    def running(self) -> bool:
        return not self._exited.done()

    async def wait(self) -> int | None:
        return await asyncio.shield(self._exited)

    def send_signal(self, signum: int) -> None:
        if self.running:
            signal.pidfd_send_signal(self._pidfd, signum)

    def exited(self, code: int | None) -> None:
        if not self.running:
            return
        self.returncode = code
        self._exited.set_result(code)
        with contextlib.suppress(OSError):
            os.close(self._pidfd)

    def orphaned(self) -> None:
        """Its preload process is gone: its end is seen on its pidfd (its status unknown)."""
        if not self.running:
            return
        loop = asyncio.get_running_loop()

        def gone() -> None:
            loop.remove_reader(self._pidfd)
            self.exited(None)

        loop.add_reader(self._pidfd, gone)


@final
class PreloadProcess:
    """One generation's preload process, as the supervisor drives it."""

    def __init__(self, process: asyncio.subprocess.Process, sock: socket.socket) -> None:
        self._process = process
        self._sock = sock
        self._loaded: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._forks: dict[int, asyncio.Future[ForkedProcess]] = {}
        self._children: dict[int, ForkedProcess] = {}
        self._next = 0
        self._open = True
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def serving(self) -> bool:
        """It loaded the app and can fork workers."""
        return self._open and self._loaded.done() and self._loaded.result() is None

    @classmethod
    async def start(
        cls,
        generation: int,
        config: dict[str, Any],
        listeners: Sequence[socket.socket],
        tally: int,
    ) -> PreloadProcess | None:
        """Start the preload process of ``generation`` and wait until it imported the app;
        None (and a log line saying why) when it could not: its workers are then spawned."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fds = [sock.fileno() for sock in listeners]
        command = [
            sys.executable, "-m", "forgezero_lifecycle.serve.preload",
            "--channel-fd", str(theirs.fileno()), "--supervisor-pid", str(os.getpid()),
            *(f"--listen-fd={fd}" for fd in fds), "--tally-fd", str(tally),
        ]  # fmt: skip
        try:
            process = await asyncio.create_subprocess_exec(
                *command, pass_fds=(theirs.fileno(), *fds, tally), stdin=asyncio.subprocess.DEVNULL
            )
        except OSError as error:
            ours.close()
            logger.error("supervisor.preload_failed generation=%d: %s", generation, error)
            return None
        finally:
            theirs.close()
        ours.setblocking(False)
        preload = cls(process, ours)
        try:
            preload._send({"app": config["app"], "options": config["options"]})
            async with asyncio.timeout(config["options"]["start_timeout"]):
                why = await preload._loaded
        except OSError:  # its channel failed: _gone said why
            why = preload._loaded.result()
        except TimeoutError:
            why = "it did not import the app within --start-timeout"
        except BaseException:
            await preload.kill()
            raise
        if why is not None:
            logger.error(
                "supervisor.preload_failed generation=%d pid=%d: %s; its workers import the "
                "app themselves",
                generation,
                process.pid,
                why,
            )
            await preload.kill()
            return None
        logger.info("supervisor.preloaded generation=%d pid=%d", generation, process.pid)
        return preload

    async def fork(self, channel: socket.socket) -> ForkedProcess:
        """A worker forked with ``channel`` as its end of the supervisor's channel; OSError
        when the preload process cannot fork it (gone, or out of processes)."""
        if not self.serving:
            raise OSError("the preload process is gone")
        self._next += 1
        number = self._next
        forked: asyncio.Future[ForkedProcess] = asyncio.get_running_loop().create_future()
        self._forks[number] = forked
        try:
            self._send({"fork": number}, fds=[channel.fileno()])
            return await forked
        finally:
            self._forks.pop(number, None)

    def _send(self, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
        try:
            socket.send_fds(self._sock, [orjson.dumps(message)], list(fds))
        except OSError as error:
            self._gone(f"its channel failed: {error}")
            raise OSError("the preload process is gone") from error

    def _readable(self) -> None:
        while self._open:
            try:
                data, fds, _, _ = socket.recv_fds(self._sock, MAX_PACKET, 1)
            except BlockingIOError:
                return
            except OSError as error:
                self._gone(f"its channel failed: {error}")
                return
            if not data:
                self._gone("it exited")
                return
            self._take(orjson.loads(data), fds)

    def _take(self, message: object, fds: list[int]) -> None:
        if not isinstance(message, dict):
            pass  # not from the preload process this module starts: ignored
        elif "loaded" in message or "failed" in message:
            if not self._loaded.done():
                self._loaded.set_result(message.get("failed"))
        elif "fork" in message:
            waiting = self._forks.get(message["fork"])
            if "pid" in message and fds:
                child = self._children[message["pid"]] = ForkedProcess(message["pid"], fds[0])
                if waiting is not None and not waiting.done():
                    waiting.set_result(child)
                return
            if waiting is not None and not waiting.done():
                waiting.set_exception(OSError(message.get("error", "the fork failed")))
        elif "exited" in message:
            reaped = self._children.get(message["exited"])
            if reaped is not None:
                del self._children[reaped.pid]
                reaped.exited(int(message["code"]))
        for fd in fds:  # a descriptor no message above kept
            os.close(fd)

    def _gone(self, why: str, *, lost: bool = True) -> None:
        """Its channel is over (``lost``: not by :meth:`close`); what waited on it is told."""
        if not self._open:
            return
        self._open = False
        asyncio.get_running_loop().remove_reader(self._sock.fileno())
        self._sock.close()
        if not self._loaded.done():
            self._loaded.set_result(why)
        elif lost and (self._children or self._forks):
            logger.warning("supervisor.preload_lost pid=%d: %s", self.pid, why)
        for waiting in self._forks.values():
            if not waiting.done():
                waiting.set_exception(OSError(f"the preload process is gone: {why}"))
        for child in self._children.values():
            child.orphaned()
        self._children.clear()

    def close(self) -> None:
        """Tell it to exit (end of file on its channel): its generation is over."""
        self._gone("closed by the supervisor", lost=False)

    async def aclose(self) -> None:
        """Tell it to exit and wait until it did (killed after :data:`CLOSE_BOUND`)."""
        self.close()
        try:
            async with asyncio.timeout(CLOSE_BOUND):
                await self._process.wait()
        except TimeoutError:
            await self.kill()

    async def kill(self) -> None:
        """End it now (it never served, or did not exit when told) and wait until it did."""
        self.close()
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
        await self._process.wait()
