"""The generation-wide control paths (``serve --workers``): a worker forwards them, the
supervisor answers them for the whole generation.

A worker's control plane does not answer the drain paths (``drain/v1/begin|status|current|
rollback``), ``schedules/v1/status``, ``metrics`` or ``supervisor/v1/reload|handover`` itself:
:class:`GenerationControl` (pure ASGI, in the worker) sends each such request over the worker's
private channel as one ``control`` command, every field latin-1 text::

    {"method", "path", "query", "headers": [[name, value], ...], "client", "body"}

and :class:`ForwardedControl` (in the supervisor, one per generation) answers it with
``{"status", "headers", "body"}``: the drain paths through a
:class:`~forgezero_lifecycle.asgi.control.ControlApp` over the generation's drain controller, so
validation, authentication and error codes are the single-process ones, with the per-worker
picture in ``detail``; ``metrics`` as every worker's scrape, labelled with its worker;
``reload`` as the begin of a handover, answered with its number, and ``handover`` from the
supervisor's record of it (:mod:`.handovers`). A supervisor that does not answer in time is a 503
``RUNTIME_SUPERVISOR_UNAVAILABLE``.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Final, final
from urllib.parse import parse_qs

import orjson

from ..asgi._body import discard_body
from ..asgi._paths import app_path
from ..asgi._types import ASGIApp, Message, Receive, Scope, Send
from ..asgi.control import MAX_CONTROL_BODY_BYTES, ControlApp
from ..wire import paths
from ..wire.supervisor import ReloadAccepted
from .channel import Channel, ChannelClosedError
from .handovers import HandoverLog
from .options import ServeOptions

if TYPE_CHECKING:
    from .generation import Generation

__all__ = ["FORWARDED_PATHS", "ForwardedControl", "GenerationControl"]

#: Control paths answered by the supervisor for the whole generation.
FORWARDED_PATHS: Final = frozenset(
    {
        paths.RUNTIME_DRAIN_BEGIN_PATH,
        paths.RUNTIME_DRAIN_STATUS_PATH,
        paths.RUNTIME_DRAIN_CURRENT_PATH,
        paths.RUNTIME_DRAIN_ROLLBACK_PATH,
        paths.RUNTIME_SCHEDULES_STATUS_PATH,
        paths.RUNTIME_METRICS_PATH,
    }
)
#: The paths that exist only under a supervisor (``forgezero-lifecycle reload``).
SUPERVISOR_PATHS: Final = frozenset(
    {paths.RUNTIME_SUPERVISOR_RELOAD_PATH, paths.RUNTIME_SUPERVISOR_HANDOVER_PATH}
)
#: The answer when the supervisor does not answer a forwarded request.
_UNAVAILABLE: Final = b'{"error":"RUNTIME_SUPERVISOR_UNAVAILABLE"}'


# The worker's end.


@final
class GenerationControl:
    """Pure ASGI, in a worker: the generation-wide control paths go to the supervisor, the rest
    to ``app``."""

    def __init__(self, app: ASGIApp, /, *, channel: Channel) -> None:
        self.app = app
        self._channel = channel

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = app_path(scope)
        if path.rstrip("/") not in FORWARDED_PATHS and path.rstrip("/") not in SUPERVISOR_PATHS:
            await self.app(scope, receive, send)
            return
        body = await _read_capped(receive)
        client = scope.get("client") or ("", 0)
        forwarded = {
            "method": scope["method"],
            "path": path,
            "query": scope.get("query_string", b"").decode("latin-1"),
            "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]],
            "client": client[0],
            "body": body.decode("latin-1"),
        }
        try:
            answer = await self._channel.request("control", timeout=30.0, request=forwarded)
        except (ChannelClosedError, TimeoutError):
            answer = {"status": 503, "headers": [], "body": _UNAVAILABLE.decode("latin-1")}
        await discard_body(scope, receive)
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer["headers"]]
        if not any(k == b"content-type" for k, _ in headers):
            headers.append((b"content-type", b"application/json"))
        await send({"type": "http.response.start", "status": answer["status"], "headers": headers})
        await send({"type": "http.response.body", "body": answer["body"].encode("latin-1")})


async def _read_capped(receive: Receive) -> bytes:
    """The request body, but never more than one byte past the control plane's limit."""
    body = bytearray()
    while len(body) <= MAX_CONTROL_BODY_BYTES:
        message: Message = await receive()
        if message["type"] != "http.request":
            break
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    return bytes(body[: MAX_CONTROL_BODY_BYTES + 1])


# The supervisor's end.


@final
class ForwardedControl:
    """One generation's answers, in the supervisor, to the control requests its workers forward."""

    def __init__(
        self,
        generation: Generation,
        options: ServeOptions,
        *,
        on_reload: Callable[[], int | None],
        handovers: HandoverLog,
    ) -> None:
        self._generation = generation
        self._options = options
        self._on_reload = on_reload
        self._handovers = handovers
        self._schedules: list[object] = []
        controller = generation.controller
        self.app = ControlApp(
            drain=controller,
            is_ready=lambda: not controller.active,
            intake_closed=lambda: controller.active,
            control_token=options.control_token,
            schedules=lambda: self._schedules,
            loopback_only=options.insecure_loopback_control,
        )

    async def answer(self, forwarded: dict[str, Any]) -> dict[str, Any]:
        """Answer a control path a worker's control plane forwarded, for the whole generation."""
        if forwarded["path"].rstrip("/") == paths.RUNTIME_SUPERVISOR_RELOAD_PATH:
            return self._reload(forwarded)
        if forwarded["path"].rstrip("/") == paths.RUNTIME_SUPERVISOR_HANDOVER_PATH:
            return self._handover(forwarded)
        if forwarded["path"].rstrip("/") == paths.RUNTIME_METRICS_PATH:
            return await self._metrics(forwarded)
        await self._refresh()
        status, headers, body = await _call_asgi(self.app, forwarded)
        path = forwarded["path"].rstrip("/")
        if path in (paths.RUNTIME_DRAIN_BEGIN_PATH, paths.RUNTIME_DRAIN_ROLLBACK_PATH):
            await self._generation.acknowledged()
        if status == 200 and path != paths.RUNTIME_SCHEDULES_STATUS_PATH:
            document = orjson.loads(body)
            document["detail"] = self._generation.detail()
            body = orjson.dumps(document)
            headers = [(k, v) for k, v in headers if k != "content-length"]
        return {"status": status, "headers": headers, "body": body.decode("latin-1")}

    async def _refresh(self) -> None:
        """Fresh counters and schedules from every worker (bounded by the command timeout)."""
        workers = self._generation.workers
        answers = await asyncio.gather(
            *(worker.command("schedules") for worker in workers),
            *(worker.command("status") for worker in workers),
        )
        schedules: list[object] = []
        for worker, answer in zip(workers, answers[: len(workers)], strict=True):
            schedules.extend(
                {**entry, "worker": worker.index, "pid": worker.pid}
                for entry in answer.get("schedules", [])
            )
        self._schedules = schedules

    async def _metrics(self, forwarded: dict[str, Any]) -> dict[str, Any]:
        """``GET metrics`` (opt-in, no token): every worker's scrape, labelled with its worker."""
        if forwarded["method"] not in ("GET", "HEAD"):
            return _json_answer(
                405, {"error": "RUNTIME_METHOD_NOT_ALLOWED"}, [("allow", "GET, HEAD")]
            )
        workers = [worker for worker in self._generation.workers if not worker.exited.is_set()]
        answers = await asyncio.gather(*(worker.command("metrics") for worker in workers))
        scraped = [
            ({"worker": str(worker.index), "pid": str(worker.pid)}, answer["text"].encode())
            for worker, answer in zip(workers, answers, strict=True)
            if isinstance(answer.get("text"), str)
        ]
        if not scraped:  # the app serves no metrics: the path is unknown, as in one process
            return _json_answer(404, {"error": "RUNTIME_NOT_FOUND"}, [])
        from prometheus_client import CONTENT_TYPE_LATEST

        from ..metrics import merge_expositions

        body = b"" if forwarded["method"] == "HEAD" else merge_expositions(scraped)
        headers = [["content-type", CONTENT_TYPE_LATEST]]
        return {"status": 200, "headers": headers, "body": body.decode("latin-1")}

    def _reload(self, forwarded: dict[str, Any]) -> dict[str, Any]:
        """``POST supervisor/v1/reload`` (control token): begin a handover."""
        refused = self._refused(forwarded, "POST")
        if refused is not None:
            return refused
        number = self._on_reload()
        if number is None:
            detail = "a handover or the stop is running; try again once it is done"
            return _json_answer(409, {"error": "RUNTIME_RELOAD_BUSY", "detail": detail}, [])
        return _json_answer(202, ReloadAccepted(handover=number).model_dump(mode="json"), [])

    def _handover(self, forwarded: dict[str, Any]) -> dict[str, Any]:
        """``GET supervisor/v1/handover[?handover=N]`` (control token): how a handover went."""
        refused = self._refused(forwarded, "GET")
        if refused is not None:
            return refused
        wanted = parse_qs(forwarded["query"]).get("handover", [None])[-1]
        number = int(wanted) if wanted and wanted.isascii() and wanted.isdigit() else None
        handover = self._handovers.find(number) if wanted is None or number else None
        if handover is None:
            detail = (
                "no handover has begun"
                if wanted is None
                else "no handover with this number (give the number reload answered)"
            )
            return _json_answer(404, {"error": "RUNTIME_NOT_FOUND", "detail": detail}, [])
        return _json_answer(200, handover.wire(), [])

    def _refused(self, forwarded: dict[str, Any], method: str) -> dict[str, Any] | None:
        """The answer for a wrong method or a missing control token, else None."""
        if forwarded["method"] != method:
            return _json_answer(405, {"error": "RUNTIME_METHOD_NOT_ALLOWED"}, [("allow", method)])
        headers = {k.lower(): v for k, v in forwarded["headers"]}
        token = self._options.control_token
        if _authorized(headers.get("authorization", ""), token) or (
            token is None
            and self._options.insecure_loopback_control
            and forwarded["client"] in ("127.0.0.1", "::1")
        ):
            return None
        return _json_answer(
            401, {"error": "RUNTIME_UNAUTHORIZED"}, [("www-authenticate", "Bearer")]
        )


def _authorized(header: str, token: str | None) -> bool:
    scheme, _, presented = header.partition(" ")
    if token is None or scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.encode(), token.encode())


async def _call_asgi(
    app: ControlApp, forwarded: dict[str, Any]
) -> tuple[int, list[tuple[str, str]], bytes]:
    """Run one forwarded request through ``app`` in this process."""
    body = forwarded["body"].encode("latin-1")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": forwarded["method"],
        "scheme": "http",
        "path": forwarded["path"],
        "raw_path": forwarded["path"].encode("latin-1"),
        "root_path": "",
        "query_string": forwarded["query"].encode("latin-1"),
        "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in forwarded["headers"]],
        "client": (forwarded["client"], 0),
        "server": None,
    }
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if delivered:
            return {"type": "http.disconnect"}
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    start: dict[str, Any] = {}
    chunks: list[bytes] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in start.get("headers", [])]
    return int(start.get("status", 500)), headers, b"".join(chunks)


def _json_answer(
    status: int, body: dict[str, object], headers: list[tuple[str, str]]
) -> dict[str, Any]:
    return {
        "status": status,
        "headers": [
            ["content-type", "application/json"],
            ["cache-control", "no-store"],
            *map(list, headers),
        ],
        "body": orjson.dumps(body).decode("latin-1"),
    }
