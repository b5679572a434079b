"""The control plane: every path of the wire protocol (README, "Wire protocol") as one ASGI app.

Authentication is a bearer token compared with :func:`hmac.compare_digest` (the control token for
drain and handoff control, the separate handoff token for state export). Bodies are capped at
16 KiB before parsing, must be ``application/json`` and strict UTF-8 JSON. Every error is
``{"error": CODE}`` (plus an optional ``detail`` that never holds a token) with the status
:func:`status_for` maps its class to; a 5xx for any client input is a bug.
"""

from __future__ import annotations

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
    BodyTooLargeError,
    ContentTypeInvalidError,
    ControlPathNotFoundError,
    DrainConflictError,
    DrainNotFoundError,
    DrainRequestInvalidError,
    LifecycleError,
    MethodNotAllowedError,
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
    from ..wire.accepted import Accepted

__all__ = ["MAX_CONTROL_BODY_BYTES", "ControlApp", "status_for"]

logger = logging.getLogger("forgezero_lifecycle.control")

MAX_CONTROL_BODY_BYTES: Final = 16 * 1024
_LOOPBACK: Final = frozenset({"127.0.0.1", "::1"})
_FORWARDING_HEADERS: Final = ("forwarded", "x-forwarded-for", "x-forwarded-host", "x-real-ip")
_LOOPBACK_HOST: Final = re.compile(r"(?:localhost|127\.0\.0\.1|\[::1\])(?::[0-9]{1,5})?", re.I)


def status_for(error: LifecycleError) -> int:
    """The HTTP status of a library error on the control plane (always 4xx)."""
    code = error.code
    if isinstance(error, UnauthorizedError):
        return 401
    if isinstance(error, BodyTooLargeError) or code == "RUNTIME_STATE_EXPORT_TOO_LARGE":
        return 413
    if isinstance(error, ContentTypeInvalidError):
        return 415
    if isinstance(error, DrainNotFoundError | StateNotFoundError | ControlPathNotFoundError):
        return 404
    if isinstance(error, MethodNotAllowedError):
        return 405
    if isinstance(error, DrainConflictError | StateConflictError):
        return 409
    if isinstance(error, StateExportError):
        return 422
    return 400


#: The token a route requires: the control token, the handoff token (state export) or none.
_Token = Literal["control", "handoff"]


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
        begin_drain: Callable[[object], Accepted] | None = None,
    ) -> None:
        self._drain = drain
        #: Begins a drain requested through this control plane (default: ``drain.begin``).
        self._begin_drain = begin_drain or drain.begin
        self._handoff = handoff
        self._is_ready = is_ready
        self._intake_closed = intake_closed
        self._schedules = schedules
        self._tokens: dict[_Token, bytes | None] = {
            "control": None if control_token is None else control_token.encode(),
            "handoff": None if handoff_token is None else handoff_token.encode(),
        }
        self._loopback_only = loopback_only
        self._routes: Mapping[str, _Route] = {
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

    async def _drain_begin(self, request: Request) -> Response:
        accepted = self._begin_drain(await _json_body(request))
        return _json(accepted.model_dump(), 202)

    async def _drain_status(self, request: Request) -> Response:
        nonce = request.query_params.get("nonce")
        if nonce is None:
            raise DrainNotFoundError(detail="the nonce query parameter is required")
        status = self._drain.status(nonce)
        return _json(status.model_dump(mode="json", exclude_none=True), 200)

    async def _drain_current(self, request: Request) -> Response:
        status = self._drain.current()
        return _json(status.model_dump(mode="json", exclude_none=True), 200)

    async def _drain_rollback(self, request: Request) -> Response:
        from ..wire.drain import parse_rollback_request  # pydantic, on the first rollback

        rollback = parse_rollback_request(await _json_body(request))
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
        document = await handoff.export_document(
            query.get("sourceRevision"), query.get("targetRevision")
        )
        # Canonical JSON, the bytes the digest covers: byte-stable, and able to carry what JSON
        # allows (lone surrogates in keys included), which pydantic's JSON mode cannot. What
        # sealing it left behind is freed once the last byte is sent, not on the way to it.
        return _json_bytes(document, 200, background=BackgroundTask(_released, handoff))

    async def _state_begin(self, request: Request) -> Response:
        body = await _json_body(request, _state_body_not_json)
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

    def _require_handoff(self) -> StateHandoffController[Any]:
        if self._handoff is None:
            raise StateNotFoundError(detail="this runtime has no state adapter")
        return self._handoff


def _require_direct_loopback(request: Request) -> None:
    """``insecure_loopback_control``: a loopback client, talking to us directly, by a loopback name.

    ``scope["client"]`` is what the server says the peer is, and a server trusting proxy headers
    (uvicorn's ``ProxyHeadersMiddleware`` under ``FORWARDED_ALLOW_IPS``) rewrites it from
    ``X-Forwarded-For``, so a request that names any forwarding header is refused: a direct
    loopback client sends none, and one relayed by a proxy on this host is not local. The
    ``Host`` must be a loopback name too, which a browser page reaching us through DNS
    rebinding cannot send.
    """
    client = request.client.host if request.client else ""
    if client not in _LOOPBACK:
        raise UnauthorizedError(detail="no control token is configured: loopback clients only")
    headers = request.headers
    if any(name in headers for name in _FORWARDING_HEADERS):
        raise UnauthorizedError(
            detail="no control token is configured: a proxied request (X-Forwarded-For, "
            "Forwarded, X-Real-IP) is not a loopback client"
        )
    host = headers.get("host", "")
    if _LOOPBACK_HOST.fullmatch(host) is None:
        raise UnauthorizedError(
            detail="no control token is configured: the Host must be localhost, 127.0.0.1 or [::1]"
        )


def _drain_body_not_json() -> LifecycleError:
    return DrainRequestInvalidError(detail="the body is not strict UTF-8 JSON")


def _state_body_not_json() -> LifecycleError:
    return StateInputInvalidError("RUNTIME_STATE_REQUEST_INVALID", detail="the body is not JSON")


async def _json_body(
    request: Request, not_json: Callable[[], LifecycleError] = _drain_body_not_json
) -> object:
    """The body as JSON; one that is not is refused with the error ``not_json`` makes."""
    content_type = request.headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        raise ContentTypeInvalidError(detail="send Content-Type: application/json")
    declared = request.headers.get("content-length")
    if declared is not None and (
        not (declared.isascii() and declared.isdigit()) or int(declared) > MAX_CONTROL_BODY_BYTES
    ):
        raise BodyTooLargeError(detail=f"control bodies are at most {MAX_CONTROL_BODY_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_CONTROL_BODY_BYTES:
            raise BodyTooLargeError(
                detail=f"control bodies are at most {MAX_CONTROL_BODY_BYTES} bytes"
            )
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise not_json() from None


def _error(error: LifecycleError) -> Response:
    status = status_for(error)
    body: dict[str, str] = {"error": error.code}
    if error.detail:
        body["detail"] = error.detail
    response = _json(body, status)
    if status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    if isinstance(error, MethodNotAllowedError):
        response.headers["Allow"] = error.allow
    return response


async def _released(handoff: StateHandoffController[Any]) -> None:
    """``handoff.release_export()`` on the event loop (starlette runs a sync task in a thread)."""
    handoff.release_export()


def _json(content: object, status: int) -> Response:
    return _json_bytes(orjson.dumps(content), status)


def _json_bytes(body: bytes, status: int, background: BackgroundTask | None = None) -> Response:
    return Response(
        body,
        status_code=status,
        media_type="application/json",
        headers={"Cache-Control": "no-store"},
        background=background,
    )
