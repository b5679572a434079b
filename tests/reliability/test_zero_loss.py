"""Zero loss under load: real uvicorn generations hand over, again and again, while clients hammer.

Each round: the next generation starts; the current one is drained mid-load (the router keeps
sending to it for a moment, so refusals happen and are retried on the next generation); the next
one takes over the handed-over state; the router switches; the old process is stopped. The
servers record every request they start and finish, and every request is judged against those
records (``_verify.judge``). ``FORGEZERO_SOAK=1`` runs more rounds and longer loads.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final

import anyio
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from ._fleet import Fleet, Generation
from ._load import HttpLoad, Router, Target
from ._records import ServerRecords
from ._soak import report, scale
from ._verify import judge

pytestmark = [pytest.mark.server, pytest.mark.load, pytest.mark.anyio]

ROUNDS: Final = scale(3, 20)
CLIENTS: Final = 50
SESSIONS: Final = 50
#: Seconds of load on a generation before it is drained.
LOAD_BEFORE_DRAIN: Final = scale(1.0, 5.0)
#: Seconds the router keeps sending new requests to the draining generation (they are refused).
REFUSAL_WINDOW: Final = 0.3
#: Streams last ~0.25 s; this grace lets every admitted one finish before the notice.
HTTP_STREAM_GRACE: Final = "3"
WS_STREAM_GRACE: Final = 1.0
#: Scheduling slack on a shared 2-core machine for "the close arrives at the stream grace".
WS_CLOSE_SLACK: Final = 3.0
ACCEPTABLE_EXIT: Final = (0, -signal.SIGTERM)


@dataclass
class Round:
    """What one handover left behind."""

    old: Generation
    drained: dict[str, Any]
    drained_seen: float
    exit_code: int
    handoff: dict[str, Any]
    imported: dict[str, Any] | None


async def _hand_over(
    fleet: Fleet, router: Router, current: Generation, label: str
) -> tuple[Round, Generation]:
    """Start ``label``, drain ``current`` mid-load, hand state over, switch, stop ``current``."""
    following = await fleet.start(label, FZREL_STREAM_GRACE=HTTP_STREAM_GRACE)
    router.standby = Target.open(label, following.url, CLIENTS + 10)
    await anyio.sleep(LOAD_BEFORE_DRAIN)
    nonce = await current.begin_drain(following)
    await anyio.sleep(REFUSAL_WINDOW)
    drained = await current.control.wait_for_status(nonce, "drained", "failed")
    drained_seen = time.monotonic()
    handoff = await following.wait_handoff(await following.take_over_state(current))
    old_target = router.switch()
    await old_target.wait_quiet()
    exit_code, _ = await fleet.stop(current)
    await old_target.http.aclose()
    imported = (await following.stats())["imported"]
    return Round(current, drained, drained_seen, exit_code, handoff, imported), following


@pytest.mark.timeout(scale(120, 1800))
async def test_http_through_handovers(fleet: Fleet) -> None:
    """HTTP load through repeated handovers loses nothing: every request completes exactly once; a
    refused one was never run and completes next door."""
    started = time.monotonic()
    current = await fleet.start("g0", FZREL_STREAM_GRACE=HTTP_STREAM_GRACE)
    router = Router(Target.open("g0", current.url, CLIENTS + 10))
    load = HttpLoad(router, clients=CLIENTS, seed=1)
    rounds: list[Round] = []
    async with anyio.create_task_group() as group:
        group.start_soon(load.run)
        for number in range(1, ROUNDS + 1):
            done, current = await _hand_over(fleet, router, current, f"g{number}")
            rounds.append(done)
        await anyio.sleep(LOAD_BEFORE_DRAIN)
        load.stop()
    await router.primary.http.aclose()
    last_exit, _ = await fleet.stop(current)

    servers = {g.label: g.records() for g in fleet.generations}
    verdict = judge(load.records, servers)
    report(
        "http-handover",
        rounds=ROUNDS,
        clients=CLIENTS,
        seconds=round(time.monotonic() - started, 1),
        **verdict.counts(),
        per_round=[_round_counts(r, servers) for r in rounds],
    )
    assert verdict.problems == []
    assert verdict.lost == 0
    assert verdict.transport_errors == 0
    assert verdict.refused_then_completed > 0, "no request met a draining generation"
    served_before = 0
    for done in rounds:
        records = servers[done.old.label]
        assert done.drained["status"] == "drained", done.drained
        assert records.last_finish <= done.drained_seen, "work finished after drained was reported"
        assert done.exit_code in ACCEPTABLE_EXIT
        served_before += len(records.finished)
        assert done.handoff["status"] == "acknowledged", done.handoff
        assert done.imported is not None
        assert done.imported["served"] == served_before
    assert last_exit in ACCEPTABLE_EXIT
    assert [p for g in fleet.generations for p in g.log_problems()] == []


def _round_counts(done: Round, servers: dict[str, ServerRecords]) -> dict[str, object]:
    records = servers[done.old.label]
    return {
        "generation": done.old.label,
        "admitted": len(records.started),
        "finished": len(records.finished),
        "drain": done.drained["status"],
    }


class _Sessions:
    """``SESSIONS`` WebSocket clients that echo continuously and follow the router on 1012."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.opened: Counter[str] = Counter()
        self.closes: list[tuple[str, int, float]] = []  # (generation, code, monotonic time)
        self.refused = 0
        self.cut_without_close = 0
        self.problems: list[str] = []
        self.stopping = anyio.Event()

    async def run(self) -> None:
        async with anyio.create_task_group() as group:
            for number in range(SESSIONS):
                group.start_soon(self._session, number)

    async def _session(self, number: int) -> None:
        target = self.router.primary
        while not self.stopping.is_set():
            try:
                async with connect(
                    target.ws_url, proxy=None, open_timeout=10, close_timeout=5
                ) as ws:
                    await self._converse(ws, target.label, number)
                return  # stopped: closed normally by us
            except InvalidStatus as refused:
                if refused.response.status_code != 503:
                    self.problems.append(
                        f"session {number}: handshake {refused.response.status_code}"
                    )
                    return
                self.refused += 1
                target = self.router.other(target)
            except ConnectionClosed as closed:
                if closed.rcvd is None:
                    self.cut_without_close += 1
                    self.problems.append(
                        f"session {number} on {target.label} cut without a close frame"
                    )
                    return
                self.closes.append((target.label, closed.rcvd.code, time.monotonic()))
                if closed.rcvd.code != 1012:
                    self.problems.append(f"session {number}: close {closed.rcvd.code}")
                    return
                target = self.router.other(target)
            except OSError as error:
                self.problems.append(f"session {number} on {target.label}: {error!r}")
                return

    async def _converse(self, ws: ClientConnection, label: str, number: int) -> None:
        greeting = await ws.recv()
        if greeting != f"hello {label}":
            self.problems.append(f"session {number}: greeting {greeting!r}")
        self.opened[label] += 1
        sent = 0
        while not self.stopping.is_set():
            sent += 1
            message = f"{number}:{sent}"
            await ws.send(message)
            with anyio.fail_after(10):
                echoed = await ws.recv()
            if echoed != message:
                self.problems.append(f"session {number}: echo {echoed!r} for {message!r}")
            await anyio.sleep(0.05)


async def _wait_for(predicate: Any, seconds: float = 15.0) -> None:
    with anyio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110 - state other tasks update
            await anyio.sleep(0.02)


@pytest.mark.timeout(scale(90, 1200))
async def test_websockets_reconnect(
    fleet: Fleet,
) -> None:
    """Open WebSockets are closed with 1012 (never cut) once the grace is over; all reconnect to the
    next generation."""
    grace = str(WS_STREAM_GRACE)
    current = await fleet.start("w0", FZREL_STREAM_GRACE=grace)
    router = Router(Target.open("w0", current.url, 1))
    sessions = _Sessions(router)
    delays: list[float] = []
    async with anyio.create_task_group() as group:
        group.start_soon(sessions.run)
        await _wait_for(lambda: sessions.opened["w0"] == SESSIONS)
        for number in range(1, ROUNDS + 1):
            label = f"w{number}"
            following = await fleet.start(label, FZREL_STREAM_GRACE=grace)
            router.standby = Target.open(label, following.url, 1)
            await anyio.sleep(scale(0.3, 2.0))  # sessions keep echoing on the current generation
            begun = time.monotonic()
            nonce = await current.begin_drain(following)
            await _wait_for(lambda label=label: sessions.opened[label] == SESSIONS)
            drained = await current.control.wait_for_status(nonce, "drained", "failed")
            assert drained["status"] == "drained", drained
            closes = [t for gen, code, t in sessions.closes if gen == current.label]
            assert len(closes) == SESSIONS
            delays.extend(t - begun for t in closes)
            old = router.switch()
            await old.http.aclose()
            exit_code, _ = await fleet.stop(current)
            assert exit_code in ACCEPTABLE_EXIT
            current = following
        sessions.stopping.set()
    await router.primary.http.aclose()

    report(
        "websocket-handover",
        rounds=ROUNDS,
        sessions=SESSIONS,
        closes_1012=sum(code == 1012 for _, code, _ in sessions.closes),
        reconnected=sum(sessions.opened.values()) - SESSIONS,
        refused_handshakes=sessions.refused,
        cut_without_close=sessions.cut_without_close,
        close_delay_min=round(min(delays), 3),
        close_delay_max=round(max(delays), 3),
        stream_grace=WS_STREAM_GRACE,
    )
    assert sessions.problems == []
    assert sessions.cut_without_close == 0
    assert len(sessions.closes) == ROUNDS * SESSIONS
    assert all(code == 1012 for _, code, _ in sessions.closes)
    assert min(delays) >= WS_STREAM_GRACE * 0.9, "closed before the stream grace was over"
    assert max(delays) <= WS_STREAM_GRACE + WS_CLOSE_SLACK
    assert [p for g in fleet.generations for p in g.log_problems()] == []
