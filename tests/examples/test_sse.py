"""examples/sse: server-sent events that end in time, as real processes.

Under uvicorn, ``forgezero-lifecycle serve`` and hypercorn, each endpoint (Starlette's
``StreamingResponse`` and sse-starlette's ``EventSourceResponse``), once the drain's notice
reaches it, sends a last event (``retry:`` and ``event: draining``) and ends the stream
cleanly. Across a ``serve --workers 2`` handover (SIGHUP), a client that reconnects with
``Last-Event-ID`` after the last event goes on at the next generation without losing an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from forgezero_lifecycle.core._httpx import tls_context
from tests.real_servers._control import (
    AUTH,
    BEGIN,
    CONTROL_TOKEN,
    SOURCE_REVISION,
    drain_request,
    new_nonce,
)
from tests.real_servers._servers import RunningServer, start_server, stop_server

pytestmark = [pytest.mark.server, pytest.mark.anyio]

ENDPOINTS: Final = ("/ticks", "/ticks-sse-starlette")
KINDS: Final = ("uvicorn-h11", "serve-h11", "hypercorn")
BOUND: Final = 30.0


@dataclass
class Event:
    id: str | None = None
    event: str = "message"
    data: str = ""
    retry: int | None = None
    fields: list[str] = field(default_factory=list)


def parse(block: str) -> Event:
    """One SSE event (its lines); comments (``: ping``) are left out."""
    event = Event()
    for line in block.splitlines():
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            event.id = value
        elif name == "event":
            event.event = value
        elif name == "data":
            event.data = value
        elif name == "retry":
            event.retry = int(value)
        if name:
            event.fields.append(name)
    return event


async def follow(
    client: httpx.AsyncClient, path: str, last_id: str | None, seen: Any = None
) -> list[Event]:
    """Every event of one connection, to its clean end (a cut raises); ``seen`` is called
    with each event as it comes."""
    headers = {} if last_id is None else {"Last-Event-ID": last_id}
    events: list[Event] = []
    async with client.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, response.status_code
        buffer = ""
        async for text in response.aiter_text():
            buffer += text.replace("\r\n", "\n")
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                event = parse(block)
                if event.fields:
                    events.append(event)
                    if seen is not None:
                        seen(event)
    return events


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    """Start examples/sse/app.py under a server kind; every process is stopped by PID."""
    started: list[RunningServer] = []

    def run(kind: str, *extra: str) -> RunningServer:
        server = start_server(
            kind,
            "examples.sse.app:app",
            log_path=tmp_path / f"{kind}.log",
            environment={
                "FORGEZERO_CONTROL_TOKEN": CONTROL_TOKEN,
                "FORGEZERO_REVISION": SOURCE_REVISION,
                "FORGEZERO_STREAM_GRACE": "0.3",
                "SSE_INTERVAL": "0.05",
                "SSE_RETRY_MS": "100",
            },
            log_level="info",
            extra_args=extra,
        )
        started.append(server)
        return server

    try:
        yield run
    finally:
        for server in started:
            stop_server(server)


def assert_told(events: list[Event], first: int) -> None:
    """Numbered events from ``first`` on, none missing, then the last event and nothing after."""
    *numbered, last = events
    assert [int(event.id or -1) for event in numbered] == list(range(first, first + len(numbered)))
    assert (last.event, last.retry, last.id) == ("draining", 100, None)


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("kind", KINDS)
async def test_last_event_then_clean_end(start: Any, kind: str, path: str) -> None:
    """A drain: the stream gets its last event (retry, event: draining) and ends cleanly; it
    began after the client's Last-Event-ID."""
    server = start(kind)
    async with httpx.AsyncClient(
        base_url=server.url, timeout=BOUND, verify=tls_context()
    ) as client:
        flowing = asyncio.Event()
        reading = asyncio.create_task(follow(client, path, "41", lambda _: flowing.set()))
        await asyncio.wait_for(flowing.wait(), BOUND)
        begun = await client.post(BEGIN, json=drain_request(new_nonce(), 5000), headers=AUTH)
        assert begun.status_code == 202
        events = await asyncio.wait_for(reading, BOUND)  # a cut stream would raise here
    assert_told(events, 42)
    assert "Traceback" not in server.log()


@pytest.mark.parametrize("path", ENDPOINTS)
async def test_handover_loses_no_event(start: Any, path: str) -> None:
    """serve --workers 2, SIGHUP: the client gets the last event, reconnects with its
    Last-Event-ID to the next generation, and every number arrives once, in order."""
    server = start("serve-h11", "--workers", "2", "--drain-timeout", "10s")
    received: list[Event] = []
    generations: set[str] = set()
    last_id: str | None = None
    deadline = time.monotonic() + BOUND

    def seen(event: Event) -> None:
        received.append(event)
        generations.add(event.data.split("pid ", 1)[1])
        if len(generations) >= 2 and len(received) >= 40:
            raise _EnoughError

    async with httpx.AsyncClient(
        base_url=server.url, timeout=BOUND, verify=tls_context()
    ) as client:
        asyncio.get_running_loop().call_later(0.5, server.process.send_signal, signal.SIGHUP)
        with contextlib.suppress(_EnoughError):
            while True:
                assert time.monotonic() < deadline, received[-3:]
                with contextlib.suppress(AssertionError):  # refused (503): try again
                    events = await follow(client, path, last_id, seen)
                    if events and events[-1].event == "draining":
                        await asyncio.sleep((events[-1].retry or 100) / 1000)
                numbered = [event for event in received if event.id is not None]
                last_id = numbered[-1].id if numbered else None
    numbered_ids = [int(event.id) for event in received if event.id is not None]
    assert numbered_ids == list(range(len(numbered_ids)))  # nothing lost, nothing twice
    assert [event.event for event in received].count("draining") == 1
    assert len(generations) == 2


class _EnoughError(Exception):
    """Events from two generations have arrived: stop reading."""
