"""The handoff vectors' harness: JSON-described adapters, a never-settling fetch, real sources.

* :class:`VectorAdapter` is the vectors' adapter: protocol, schemaVersion and maximumBytes as
  given (any JSON type), ``validate`` "any" (a model accepting every value) or "never" (a model
  refusing every value), ``exportState`` resolving with ``exported_json``, ``importState`` "ok"
  or rejecting. A JavaScript rejection with a non-Error has no Python equivalent; its analogue
  is an exception without a message, which the controller reports as ``RUNTIME_STATE_FAILED``.
* :class:`RecordingTransport` is the JavaScript conformance harness's ``fetchState`` that records
  its call and never settles: the request the controller built (URL, method, headers) is recorded,
  and the response never comes.
* :func:`serving` serves a vector's ``source`` from real loopback sockets, byte for byte.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, RootModel, model_validator

from forgezero_lifecycle._canonical import canonical_json
from forgezero_lifecycle.wire.handoff import StateImportContext
from tests.real_servers._servers import free_port


class AnyValue(RootModel[Any]):
    """``validate: "any"``: every JSON value; NaN kept so canonical JSON can refuse it."""

    model_config = ConfigDict(ser_json_inf_nan="constants")


class NeverValue(RootModel[Any]):
    """``validate: "never"``: no value validates."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    @model_validator(mode="before")
    @classmethod
    def _never(cls, value: object) -> object:
        raise ValueError("this adapter accepts no value")


_MISSING = object()  # exportState resolved without a value: not JSON, like `undefined`


@dataclass
class VectorAdapter:
    protocol: Any
    schema_version: Any
    maximum_bytes: Any
    model: type[BaseModel] = AnyValue
    exported: dict[str, Any] = field(default_factory=dict)
    on_import: Any = "ok"
    export_calls: int = 0
    import_calls: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_spec(cls, spec: dict[str, Any], validate: str = "any") -> VectorAdapter:
        return cls(
            protocol=spec.get("protocol"),
            schema_version=spec.get("schemaVersion"),
            maximum_bytes=spec.get("maximumBytes"),
            model=NeverValue if validate == "never" else AnyValue,
            on_import=spec.get("import", "ok"),
        )

    async def export_state(self) -> tuple[Any, Any]:
        self.export_calls += 1
        value = self.exported.get("value", _MISSING)
        return self.exported.get("cursor"), self.model.model_construct(value)

    async def import_state(self, value: Any, context: StateImportContext) -> None:
        self.import_calls.append(
            {
                "value_canonical": canonical_json(value.model_dump()).decode(),
                "context": context.model_dump(mode="json"),
            }
        )
        if isinstance(self.on_import, dict) and "reject_error" in self.on_import:
            raise RuntimeError(self.on_import["reject_error"])
        if isinstance(self.on_import, dict) and "reject_non_error" in self.on_import:
            raise RuntimeError()


class RecordingTransport(httpx.AsyncBaseTransport):
    """Records each request (Host aside: HTTP/1.1 needs it, fetch adds it too); never answers."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        headers = {
            key.decode(): value.decode()
            for key, value in request.headers.raw
            if key.lower() != b"host"
        }
        self.calls.append({"url": str(request.url), "method": request.method, "headers": headers})
        await asyncio.get_running_loop().create_future()  # never settles; cancelled at aclose
        raise AssertionError("unreachable")


@dataclass
class Sources:
    """What :func:`serving` exposes: ports for substitution and the requests the servers saw."""

    ports: dict[str, int]
    requests: list[dict[str, Any]] = field(default_factory=list)

    def substitute(self, text: str) -> str:
        text = text.replace("{alt_port}", str(self.ports.get("alt", 0)))
        return text.replace("{port}", str(self.ports.get("main", 0)))


@contextlib.asynccontextmanager
async def serving(spec: dict[str, Any]) -> AsyncIterator[Sources]:
    """Serve ``main`` on 127.0.0.1 and ``alt`` on 127.0.0.2, or refuse (no listener)."""
    if spec.get("refused"):
        yield Sources(ports={"main": free_port()})  # nobody listens
        return
    sources = Sources(ports={})
    release = asyncio.Event()
    handlers: set[asyncio.Task[None]] = set()
    servers: list[asyncio.Server] = []

    def handler(name: str, routes: dict[str, Any]) -> Any:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            handlers.add(task)
            try:
                await _answer(name, routes, sources, release, reader, writer)
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
                handlers.discard(task)

        return handle

    try:
        for name, host in (("main", "127.0.0.1"), ("alt", "127.0.0.2")):
            if name in spec:
                server = await asyncio.start_server(
                    handler(name, spec[name].get("routes", spec[name])), host, 0
                )
                servers.append(server)
                sources.ports[name] = server.sockets[0].getsockname()[1]
        yield sources
    finally:
        release.set()
        for server in servers:
            server.close()
        if handlers:
            await asyncio.wait(set(handlers), timeout=5)
        for server in servers:
            await server.wait_closed()


async def _answer(
    name: str,
    routes: dict[str, Any],
    sources: Sources,
    release: asyncio.Event,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    method, target, _ = request_line.split(" ", 2)
    authorization = None
    for line in header_lines:
        key, _, value = line.partition(":")
        if key.strip().lower() == "authorization":
            authorization = value.strip()
    sources.requests.append(
        {"server": name, "method": method, "target": target, "authorization": authorization}
    )
    route = routes.get(target.split("?", 1)[0])
    if route is None:
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    else:
        route = route.get("respond", route)
        stall = route.get("stall")
        if stall != "headers":
            body = base64.b64decode(route.get("body_b64", route.get("body_prefix_b64", "")))
            writer.write(sources.substitute(route["head"]).encode() + b"\r\n\r\n" + body)
        if stall is not None:
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            await release.wait()
            return
    with contextlib.suppress(ConnectionError):
        await writer.drain()
