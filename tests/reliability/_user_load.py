"""The HTTP clients of the user-load matrix (``test_user_load.py``), which ``bench.handover``
sends to every server too: one load, so that the figures of both tell the servers apart alike.

* :data:`KEEP_ALIVE` keep-alive clients (fast, slow, streamed and POST requests) and
  :data:`SLOW` slow ones that idle up to :data:`SLOW_THINK` seconds between requests on a kept
  connection;
* :data:`FRESH` clients that open a new connection per request and send it up to
  :data:`FRESH_LATENESS` seconds after the connect;
* with ``http2``, :data:`HTTP2` more clients whose requests share HTTP/2 connections (prior
  knowledge, h2c).

Each request is sent once (a client with nowhere else to go), and its outcome is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import anyio

from ._load import HttpLoad, LateSenders, RequestRecord, Router, Target

__all__ = ["FRESH", "HTTP2", "KEEP_ALIVE", "SLOW", "UserLoad"]

KEEP_ALIVE: Final = 40
SLOW: Final = 10
SLOW_THINK: Final = 1.5
FRESH: Final = 10
FRESH_LATENESS: Final = 0.3
HTTP2: Final = 10


@dataclass(frozen=True)
class UserLoad:
    """The load's clients, from :meth:`open` until :meth:`aclose`."""

    kept: tuple[HttpLoad, ...]
    fresh: LateSenders

    @classmethod
    def open(cls, url: str, label: str, *, http2: bool = False) -> UserLoad:
        kept = [
            HttpLoad(_router(label, url, KEEP_ALIVE), clients=KEEP_ALIVE, seed=1, retry=False),
            HttpLoad(
                _router(label, url, SLOW),
                clients=SLOW,
                seed=2,
                think=SLOW_THINK,
                retry=False,
                kinds=("fast", "post"),
            ),
        ]
        if http2:
            target = Target.open(label, url, 2, http2=True)
            kept.append(HttpLoad(Router(target), clients=HTTP2, seed=4, retry=False))
        fresh = LateSenders(url, label, clients=FRESH, seed=3, lateness=FRESH_LATENESS)
        return cls(tuple(kept), fresh)

    async def run(self) -> None:
        """Send until :meth:`stop`."""
        async with anyio.create_task_group() as group:
            for load in self.kept:
                group.start_soon(load.run)
            group.start_soon(self.fresh.run)

    def stop(self) -> None:
        for load in self.kept:
            load.stop()
        self.fresh.stop()

    async def aclose(self) -> None:
        for load in self.kept:
            await load.router.primary.http.aclose()

    @property
    def records(self) -> list[RequestRecord]:
        """Every request sent, in no particular order."""
        return [record for load in self.kept for record in load.records] + self.fresh.records

    @property
    def http2_requests(self) -> int:
        return sum(len(load.records) for load in self.kept[2:])


def _router(label: str, url: str, clients: int) -> Router:
    return Router(Target.open(label, url, clients + 5))
