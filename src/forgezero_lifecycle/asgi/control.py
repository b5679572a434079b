"""The control plane: every path of the wire protocol (README, "Wire protocol") as one ASGI app.

Authentication is a bearer token compared with :func:`hmac.compare_digest` (the control token for
drain and handoff control, the separate handoff token for state export). Bodies are capped at
16 KiB and must arrive within :data:`BODY_SECONDS` before parsing, must be ``application/json``
and strict UTF-8 JSON. Every error is ``{"error": CODE}`` (plus an optional ``detail`` that never
holds a token) with the status :func:`status_for` maps its class to; a 5xx for any client input
is a bug.

Under ``forgezero-lifecycle serve --workers N`` the generation-wide paths (the drain paths,
``schedules``, ``metrics`` and the supervisor's ``reload`` and ``handover``) are answered by the
supervisor for every worker at once. The worker still serves them with this same app, made by
:meth:`ControlApp.for_generation`: the request is authenticated, checked and read here, in the
worker, exactly as in one process, and only then is a small typed call (a :data:`GenerationCall`,
such as ``("drain.status", {"nonce": ...})``) handed on; its :class:`Answer` is sent back as is.
"""

from __future__ import annotations

import asyncio
import copy
import hmac
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, final

import orjson
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from .._errors import (
    BodyTimeoutError,
    BodyTooLargeError,
    ContentTypeInvalidError,
    ControlPathNotFoundError,
    DrainConflictError,
    DrainNotFoundError,
    DrainRequestInvalidError,
    LifecycleError,
    MethodNotAllowedError,
    ReloadBusyError,
    ScaleRefusedError,
    StateConflictError,
    StateExportError,
    StateInputInvalidError,
    StateNotFoundError,
    UnauthorizedError,
)
from ..wire import paths
from ._body import discard_body
from ._paths import app_path
from ._types import Message, Receive, Scope, Send

if TYPE_CHECKING:
    # Types only: the controllers and the wire models they answer with (pydantic) are loaded by
    # whoever builds them, so serving readiness and liveness never imports pydantic.
    from ..core.drain import DrainController
    from ..core.handoff import StateHandoffController

__all__ = [
    "BODY_SECONDS",
    "GENERATION_PATHS",
    "MAX_CONTROL_BODY_BYTES",
    "Answer",
    "ControlApp",
    "GenerationCall",
    "error_answer",
    "status_for",
]

logger = logging.getLogger("forgezero_lifecycle.control")

MAX_CONTROL_BODY_BYTES: Final = 16 * 1024
#: How long a control body may take to arrive, from the first byte read to the last.
BODY_SECONDS: Final = 5.0
#: The longest ``handover`` number a query may give (a supervisor counts from 1).
_HANDOVER_DIGITS: Final = 9
#: Longer than any nonce a drain can have (43 base64url characters): not found without a lookup.
_NONCE_CHARS: Final = 64
_LOOPBACK: Final = frozenset({"127.0.0.1", "::1"})
#: The headers a reverse proxy adds (nginx's ``proxy_pass`` sends ``X-Forwarded-Proto`` or
#: ``Via`` in common configurations): a request naming one was relayed, whatever its peer.
_PROXY_HEADERS: Final = frozenset({b"forwarded", b"via", b"x-real-ip"})
_PROXY_HEADER_PREFIX: Final = b"x-forwarded-"
_LOOPBACK_HOST: Final = re.compile(r"(?:localhost|127\.0\.0\.1|\[::1\])(?::[0-9]{1,5})?", re.I)


def status_for(error: LifecycleError) -> int:
    """The HTTP status of a library error on the control plane (always 4xx)."""
    code = error.code
    if isinstance(error, UnauthorizedError):
        return 401
    if isinstance(error, BodyTooLargeError) or code == "RUNTIME_STATE_EXPORT_TOO_LARGE":
        return 413
    if isinstance(error, BodyTimeoutError):
        return 408
    if isinstance(error, ContentTypeInvalidError):
        return 415
    if isinstance(error, DrainNotFoundError | StateNotFoundError | ControlPathNotFoundError):
        return 404
    if isinstance(error, MethodNotAllowedError):
        return 405
    if isinstance(
        error, DrainConflictError | StateConflictError | ReloadBusyError | ScaleRefusedError
    ):
        return 409
    if isinstance(error, StateExportError):
        return 422
    return 400


#: The token a route requires: the control token, the handoff token (state export) or none.
_Token = Literal["control", "handoff"]


@final
@dataclass(frozen=True, slots=True)
class Answer:
    """A control-plane answer made elsewhere: by a ``serve --workers`` supervisor, for the whole
    generation."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


#: Hands a generation-wide call on, ``(call, arguments) -> Answer``. The calls: ``drain.begin``
#: ``{"request": <the decoded body>}``, ``drain.status`` ``{"nonce"}``, ``drain.current`` ``{}``,
#: ``drain.rollback`` ``{"nonce"}``, ``schedules`` ``{}``, ``metrics`` ``{"head": bool}``,
#: ``reload`` ``{}``, ``handover`` ``{"number": int | None}``, ``scale`` ``{"by": 1 | -1}`` and
#: ``status`` ``{}``.
GenerationCall = Callable[[str, dict[str, object]], Awaitable[Answer]]

#: The paths a ``serve --workers`` supervisor answers for the whole generation.
GENERATION_PATHS: Final = frozenset(
    {
        paths.RUNTIME_DRAIN_BEGIN_PATH,
        paths.RUNTIME_DRAIN_STATUS_PATH,
        paths.RUNTIME_DRAIN_CURRENT_PATH,
        paths.RUNTIME_DRAIN_ROLLBACK_PATH,
        paths.RUNTIME_SCHEDULES_STATUS_PATH,
        paths.RUNTIME_METRICS_PATH,
        paths.RUNTIME_SUPERVISOR_RELOAD_PATH,
        paths.RUNTIME_SUPERVISOR_HANDOVER_PATH,
        paths.RUNTIME_SUPERVISOR_SCALE_PATH,
        paths.RUNTIME_SUPERVISOR_STATUS_PATH,
    }
)

_NOT_SUPERVISED: Final = (
    "this process runs alone: only `forgezero-lifecycle serve --workers N` hands over to a new "
    "generation (SIGHUP or reload); here, restart the process to run new code"
)


def error_answer(error: LifecycleError) -> Answer:
    """``error`` as the control plane answers it (status, ``{"error", "detail"}``, headers)."""
    body: dict[str, str] = {"error": error.code}
    if error.detail:
        body["detail"] = error.detail
    status = status_for(error)
    headers: tuple[tuple[str, str], ...] = ()
    if status == 401:
        headers = (("www-authenticate", "Bearer"),)
    elif isinstance(error, MethodNotAllowedError):
        headers = (("allow", error.allow),)
    return Answer(status, orjson.dumps(body), headers=headers)


@dataclass(frozen=True, slots=True)
class _Route:
    handler: Callable[[Request], Awaitable[Response]]
    method: Literal["GET", "POST"]
    token: _Token | None


@final
class ControlApp:
    """An ASGI app serving the control protocol for one runtime."""

    def __init__(
        self,
        *,
        drain: DrainController,
        is_ready: Callable[[], bool],
        intake_closed: Callable[[], bool],
        control_token: str | None,
        handoff_token: str | None = None,
        handoff: StateHandoffController[Any] | None = None,
        schedules: Callable[[], object] | None = None,
        loopback_only: bool = False,
        body_timeout: float = BODY_SECONDS,
    ) -> None:
        self._drain = drain
        self._handoff = handoff
        self._is_ready = is_ready
        self._intake_closed = intake_closed
        self._schedules = schedules
        self._tokens: dict[_Token, bytes | None] = {
            "control": None if control_token is None else control_token.encode(),
            "handoff": None if handoff_token is None else handoff_token.encode(),
        }
        self._loopback_only = loopback_only
        self._body_timeout = body_timeout
        self._generation: GenerationCall | None = None
        self._routes: Mapping[str, _Route] = self._local_routes()

    def for_generation(self, generation: GenerationCall) -> ControlApp:
        """This control plane with the generation-wide paths (:data:`GENERATION_PATHS`) handed
        to ``generation`` once they are authenticated and checked (``serve --workers``)."""
        forwarding = copy.copy(self)
        forwarding._generation = generation
        forwarding._routes = {
            **forwarding._local_routes(),
            paths.RUNTIME_DRAIN_BEGIN_PATH: _Route(forwarding._forward_begin, "POST", "control"),
            paths.RUNTIME_DRAIN_STATUS_PATH: _Route(forwarding._forward_status, "GET", "control"),
            paths.RUNTIME_DRAIN_CURRENT_PATH: _Route(forwarding._forward_current, "GET", "control"),
            paths.RUNTIME_DRAIN_ROLLBACK_PATH: _Route(
                forwarding._forward_rollback, "POST", "control"
            ),
            paths.RUNTIME_SCHEDULES_STATUS_PATH: _Route(
                forwarding._forward_schedules, "GET", "control"
            ),
            # Opt-in and without a token, as in one process (``asgi.published``).
            paths.RUNTIME_METRICS_PATH: _Route(forwarding._forward_metrics, "GET", None),
            paths.RUNTIME_SUPERVISOR_RELOAD_PATH: _Route(forwarding._reload, "POST", "control"),
            paths.RUNTIME_SUPERVISOR_HANDOVER_PATH: _Route(forwarding._handover, "GET", "control"),
            paths.RUNTIME_SUPERVISOR_SCALE_PATH: _Route(forwarding._scale, "POST", "control"),
            paths.RUNTIME_SUPERVISOR_STATUS_PATH: _Route(
                forwarding._supervisor_status, "GET", "control"
            ),
        }
        return forwarding

    def _local_routes(self) -> dict[str, _Route]:
        return {
            paths.RUNTIME_DRAIN_BEGIN_PATH: _Route(self._drain_begin, "POST", "control"),
            paths.RUNTIME_DRAIN_STATUS_PATH: _Route(self._drain_status, "GET", "control"),
            paths.RUNTIME_DRAIN_ROLLBACK_PATH: _Route(self._drain_rollback, "POST", "control"),
            paths.RUNTIME_DRAIN_CURRENT_PATH: _Route(self._drain_current, "GET", "control"),
            paths.RUNTIME_STATE_EXPORT_PATH: _Route(self._state_export, "GET", "handoff"),
            paths.RUNTIME_STATE_BEGIN_PATH: _Route(self._state_begin, "POST", "control"),
            paths.RUNTIME_STATE_STATUS_PATH: _Route(self._state_status, "GET", "control"),
            paths.RUNTIME_SCHEDULES_STATUS_PATH: _Route(self._schedules_status, "GET", "control"),
            paths.RUNTIME_READY_PATH: _Route(self._ready, "GET", None),
            paths.RUNTIME_LIVE_PATH: _Route(self._live, "GET", None),
            # Served by a ``serve --workers`` supervisor only: here they say what to do instead.
            paths.RUNTIME_SUPERVISOR_RELOAD_PATH: _Route(_not_supervised, "POST", "control"),
            paths.RUNTIME_SUPERVISOR_HANDOVER_PATH: _Route(_not_supervised, "GET", "control"),
            paths.RUNTIME_SUPERVISOR_SCALE_PATH: _Route(_not_supervised, "POST", "control"),
            paths.RUNTIME_SUPERVISOR_STATUS_PATH: _Route(_not_supervised, "GET", "control"),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        body_read = False

        async def tracked_receive() -> Message:
            nonlocal body_read
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_read = True
            return message

        request = Request(scope, tracked_receive)
        try:
            response = await self._dispatch(request)
        except LifecycleError as error:
            response = _error(error)
        except ClientDisconnect:
            return  # the client hung up mid-body: nobody is left to answer, nothing changed
        except Exception:
            logger.exception("control.internal_error path=%s", scope.get("path"))
            response = _json({"error": "RUNTIME_INTERNAL_ERROR"}, 500)
        if not body_read:
            # An answer given before the body was read (401, 413, 415…): read the rest first,
            # so the client sees the answer and a keep-alive connection stays usable.
            await discard_body(scope, receive)
        await response(scope, receive, send)

    async def _dispatch(self, request: Request) -> Response:
        path = app_path(request.scope)  # request.url would decode the raw query string
        route = self._routes.get(path.rstrip("/") or path)
        if route is None:
            raise ControlPathNotFoundError(detail="no such control path")
        method = request.method
        if method != route.method and not (route.method == "GET" and method == "HEAD"):
            raise MethodNotAllowedError("GET, HEAD" if route.method == "GET" else route.method)
        if route.token is not None:
            self._authenticate(request, route.token)
        return await route.handler(request)

    def _authenticate(self, request: Request, kind: _Token) -> None:
        expected = self._tokens[kind]
        if expected is None:
            if self._loopback_only:
                _require_direct_loopback(request)
                return
            raise UnauthorizedError(detail=f"no {kind} token is configured on this runtime")
        header = request.headers.get("authorization", "")
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not presented:
            raise UnauthorizedError(detail=f"send Authorization: Bearer <{kind} token>")
        if not hmac.compare_digest(presented.encode(), expected):
            raise UnauthorizedError(
                detail=f"the bearer token does not match this runtime's {kind} token"
            )

    async def _body(
        self, request: Request, not_json: Callable[[], LifecycleError] | None = None
    ) -> object:
        return await _json_body(request, self._body_timeout, not_json or _drain_body_not_json)

    async def _drain_begin(self, request: Request) -> Response:
        accepted = self._drain.begin(await self._body(request), origin="control")
        return _json(accepted.model_dump(), 202)

    async def _drain_status(self, request: Request) -> Response:
        status = self._drain.status(_nonce_query(request))
        return _json(status.model_dump(mode="json", exclude_none=True), 200)

    async def _drain_current(self, request: Request) -> Response:
        status = self._drain.current()
        return _json(status.model_dump(mode="json", exclude_none=True), 200)

    async def _drain_rollback(self, request: Request) -> Response:
        from ..wire.drain import parse_rollback_request  # pydantic, on the first rollback

        rollback = parse_rollback_request(await self._body(request))
        status = self._drain.rollback(rollback.nonce)
        return _json(status.model_dump(mode="json", exclude_none=True), 200)

    async def _state_export(self, request: Request) -> Response:
        handoff = self._require_handoff()
        if not self._intake_closed():
            raise StateConflictError(
                "RUNTIME_STATE_NOT_DRAINING",
                detail="begin a drain first: export needs closed intake",
            )
        query = request.query_params
        # Fetched for an import, which validates the value itself: not checked here as well.
        importer_checks = query.get(paths.IMPORT_CHECK_QUERY) == paths.IMPORTER_CHECKS
        document = await handoff.export_document(
            query.get("sourceRevision"),
            query.get("targetRevision"),
            check_imports=not importer_checks,
        )
        # Canonical JSON, the bytes the digest covers: byte-stable, and able to carry what JSON
        # allows (lone surrogates in keys included), which pydantic's JSON mode cannot. What
        # sealing it left behind is freed once the last byte is sent, not on the way to it.
        return _json_bytes(document, 200, background=BackgroundTask(_released, handoff))

    async def _state_begin(self, request: Request) -> Response:
        body = await self._body(request, _state_body_not_json)
        timeout_ms = body.get("timeoutMs") if isinstance(body, dict) else None
        accepted = self._require_handoff().begin(body, timeout_ms)
        return _json(dict(accepted), 202)

    async def _state_status(self, request: Request) -> Response:
        handoff = self._require_handoff()
        nonce = request.query_params.get("nonce")
        if nonce is None:
            raise StateNotFoundError(detail="the nonce query parameter is required")
        status = handoff.status(nonce)
        return _json(status.model_dump(mode="json", exclude_none=True), 200)

    async def _schedules_status(self, request: Request) -> Response:
        return _json({"schedules": self._schedules() if self._schedules else []}, 200)

    async def _ready(self, request: Request) -> Response:
        if self._is_ready():
            return _json({"ready": True}, 200)
        # The drain's own state: "draining" until it ends, then "drained" or "failed".
        return _json({"ready": False, "status": self._drain.state or "draining"}, 503)

    async def _live(self, request: Request) -> Response:
        return _json({"live": True}, 200)

    # The generation-wide paths under a supervisor (``for_generation``): checked here, then
    # handed on as small typed calls.

    async def _forward(self, call: str, arguments: dict[str, object]) -> Response:
        assert self._generation is not None
        answer = await self._generation(call, arguments)
        response = _bytes_response(answer.body, answer.status, answer.content_type)
        for name, value in answer.headers:
            response.headers[name] = value
        return response

    async def _forward_begin(self, request: Request) -> Response:
        return await self._forward("drain.begin", {"request": await self._body(request)})

    async def _forward_status(self, request: Request) -> Response:
        return await self._forward("drain.status", {"nonce": _nonce_query(request)})

    async def _forward_current(self, request: Request) -> Response:
        return await self._forward("drain.current", {})

    async def _forward_rollback(self, request: Request) -> Response:
        from ..wire.drain import parse_rollback_request  # pydantic, on the first rollback

        rollback = parse_rollback_request(await self._body(request))
        return await self._forward("drain.rollback", {"nonce": rollback.nonce})

    async def _forward_schedules(self, request: Request) -> Response:
        return await self._forward("schedules", {})

    async def _forward_metrics(self, request: Request) -> Response:
        return await self._forward("metrics", {"head": request.method == "HEAD"})

    async def _reload(self, request: Request) -> Response:
        body = await self._body(request, _reload_body_not_json)
        if not isinstance(body, dict) or body:
            raise DrainRequestInvalidError(detail="the body of a reload is the empty object {}")
        return await self._forward("reload", {})

    async def _handover(self, request: Request) -> Response:
        wanted = request.query_params.get("handover")
        number: int | None = None
        if wanted is not None:
            if not (wanted.isascii() and wanted.isdigit() and len(wanted) <= _HANDOVER_DIGITS):
                raise ControlPathNotFoundError(
                    detail="no handover with this number (give the number reload answered)"
                )
            number = int(wanted)
        return await self._forward("handover", {"number": number})

    async def _scale(self, request: Request) -> Response:
        body = await self._body(request, _scale_body_invalid)
        by = body.get("by") if isinstance(body, dict) and set(body) == {"by"} else None
        if by not in (1, -1) or isinstance(by, bool):
            raise _scale_body_invalid()
        return await self._forward("scale", {"by": by})

    async def _supervisor_status(self, request: Request) -> Response:
        return await self._forward("status", {})

    def _require_handoff(self) -> StateHandoffController[Any]:
        if self._handoff is None:
            raise StateNotFoundError(detail="this runtime has no state adapter")
        return self._handoff


def _require_direct_loopback(request: Request) -> None:
    """``insecure_loopback_control``: a loopback client, talking to us directly, by a loopback name.

    ``scope["client"]`` is what the server says the peer is, and a server trusting proxy headers
    (uvicorn's ``ProxyHeadersMiddleware`` under ``FORWARDED_ALLOW_IPS``) rewrites it from
    ``X-Forwarded-For``, so a request that names any proxy header (``Forwarded``, ``Via``,
    ``X-Real-IP`` or any ``X-Forwarded-*``) is refused: a direct loopback client sends none, and
    one relayed by a proxy on this host (whose peer is 127.0.0.1) is not local. The
    ``Host`` must be a loopback name too, which a browser page reaching us through DNS
    rebinding cannot send.
    """
    client = request.client.host if request.client else ""
    if client not in _LOOPBACK:
        raise UnauthorizedError(detail="no control token is configured: loopback clients only")
    if any(_is_proxy_header(name) for name, _ in request.scope["headers"]):
        raise UnauthorizedError(
            detail="no control token is configured: a proxied request (Forwarded, Via, "
            "X-Real-IP, X-Forwarded-*) is not a loopback client"
        )
    host = request.headers.get("host", "")
    if _LOOPBACK_HOST.fullmatch(host) is None:
        raise UnauthorizedError(
            detail="no control token is configured: the Host must be localhost, 127.0.0.1 or [::1]"
        )


def _is_proxy_header(raw: bytes) -> bool:
    name = raw.lower()
    return name in _PROXY_HEADERS or name.startswith(_PROXY_HEADER_PREFIX)


async def _not_supervised(request: Request) -> Response:
    raise ControlPathNotFoundError(detail=_NOT_SUPERVISED)


def _nonce_query(request: Request) -> str:
    nonce = request.query_params.get("nonce")
    if nonce is None:
        raise DrainNotFoundError(detail="the nonce query parameter is required")
    if len(nonce) > _NONCE_CHARS:
        raise DrainNotFoundError(detail="the nonce must be 43 base64url characters")
    return nonce


def _reload_body_not_json() -> LifecycleError:
    return DrainRequestInvalidError(detail="the body of a reload is the empty object {}")


def _scale_body_invalid() -> LifecycleError:
    return DrainRequestInvalidError(detail='the body of a scale is {"by": 1} or {"by": -1}')


def _drain_body_not_json() -> LifecycleError:
    return DrainRequestInvalidError(detail="the body is not strict UTF-8 JSON")


def _state_body_not_json() -> LifecycleError:
    return StateInputInvalidError("RUNTIME_STATE_REQUEST_INVALID", detail="the body is not JSON")


async def _json_body(
    request: Request, timeout: float, not_json: Callable[[], LifecycleError]
) -> object:
    """The body as JSON, read within ``timeout`` seconds; one that is not JSON is refused with the
    error ``not_json`` makes."""
    content_type = request.headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        raise ContentTypeInvalidError(detail="send Content-Type: application/json")
    declared = request.headers.get("content-length")
    if declared is not None and (
        not (declared.isascii() and declared.isdigit()) or int(declared) > MAX_CONTROL_BODY_BYTES
    ):
        raise BodyTooLargeError(detail=f"control bodies are at most {MAX_CONTROL_BODY_BYTES} bytes")
    body = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_CONTROL_BODY_BYTES:
                    raise BodyTooLargeError(
                        detail=f"control bodies are at most {MAX_CONTROL_BODY_BYTES} bytes"
                    )
    except TimeoutError:
        raise BodyTimeoutError(
            detail=f"the body did not arrive within {timeout:g} s; send it at once"
        ) from None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise not_json() from None


def _error(error: LifecycleError) -> Response:
    answer = error_answer(error)
    response = _json_bytes(answer.body, answer.status)
    for name, value in answer.headers:
        response.headers[name] = value
    return response


async def _released(handoff: StateHandoffController[Any]) -> None:
    """``handoff.release_export()`` on the event loop (starlette runs a sync task in a thread)."""
    handoff.release_export()


def _json(content: object, status: int) -> Response:
    return _json_bytes(orjson.dumps(content), status)


def _json_bytes(body: bytes, status: int, background: BackgroundTask | None = None) -> Response:
    return _bytes_response(body, status, "application/json", background)


def _bytes_response(
    body: bytes, status: int, media_type: str, background: BackgroundTask | None = None
) -> Response:
    return Response(
        body,
        status_code=status,
        media_type=media_type,
        headers={"Cache-Control": "no-store"},
        background=background,
    )
