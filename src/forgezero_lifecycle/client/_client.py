"""The async control client: requests, answers as wire models, errors as the library's, retries.

The package docstring (:mod:`forgezero_lifecycle.client`) states the rules this module keeps.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Coroutine
from typing import Any, Final, Literal, Self, TypeVar, final

import httpx
import orjson
from pydantic import BaseModel, ValidationError

from .._errors import ConfigurationError, ControlUnreachableError, RemoteError, error_for_code
from .._tokens import check_handoff_token
from ..core._httpx import tls_context
from ..wire import paths
from ..wire.accepted import Accepted
from ..wire.drain import DRAIN_PROTOCOL, DrainRequest, DrainStatus
from ..wire.handoff import StateEnvelope, StateHandoffRequest, StateHandoffStatus, StateSource
from ..wire.supervisor import HandoverStatus, ReloadAccepted

__all__ = ["ControlClient", "drain_request", "handoff_request", "new_nonce"]

logger = logging.getLogger("forgezero_lifecycle.client")

M = TypeVar("M", bound=BaseModel)

DEFAULT_TIMEOUT: Final = 10.0
DEFAULT_RETRIES: Final = 3
DEFAULT_POLL_INTERVAL: Final = 0.25
_BACKOFF_FIRST: Final = 0.1
_BACKOFF_MAX: Final = 1.0
_GATEWAY_STATUSES: Final = frozenset({502, 503, 504})
_FINAL_DRAIN: Final = frozenset({"drained", "failed", "rolled-back"})
_FINAL_HANDOFF: Final = frozenset({"acknowledged", "failed"})

_NOT_READY: Final = frozenset({503})

_Auth = Literal["control", "handoff", "none"]


def new_nonce() -> str:
    """A fresh nonce: 32 random bytes as 43 base64url characters (``secrets.token_urlsafe``).

    Never one that starts with ``-``, which a command line would take for a flag.
    """
    while (nonce := secrets.token_urlsafe(32)).startswith("-"):
        pass
    return nonce


def drain_request(
    *, source_revision: str, target_revision: str, timeout_ms: int, nonce: str | None = None
) -> DrainRequest:
    """A validated ``forgezero-drain/v1`` request; a fresh nonce unless one is given."""
    return DrainRequest(
        protocol=DRAIN_PROTOCOL,
        nonce=nonce or new_nonce(),
        source_revision=source_revision,
        target_revision=target_revision,
        timeout_ms=timeout_ms,
    )


def handoff_request(
    *,
    protocol: str,
    schema_version: int,
    source_revision: str,
    target_revision: str,
    source_url: str,
    handoff_token: str,
    nonce: str | None = None,
) -> StateHandoffRequest:
    """A validated state handoff request: the new generation fetches ``source_url`` itself.

    ``source_url`` is the old generation's export URL, its revisions in the query; add
    ``importCheck=importer`` there too, as ``forgezero-lifecycle handoff`` does, and the old
    generation leaves the check that the value imports as its model to the new one, which makes
    it anyway (docs/handoff.md).

    A handoff token that is not 43 base64url characters raises :class:`ConfigurationError`
    (``RUNTIME_CONFIG_INVALID``), which never shows the token.
    """
    check_handoff_token(handoff_token)
    return StateHandoffRequest(
        protocol=protocol,
        nonce=nonce or new_nonce(),
        schema_version=schema_version,
        source_revision=source_revision,
        target_revision=target_revision,
        source=StateSource(url=source_url, authorization=f"Bearer {handoff_token}"),
    )


@final
class ControlClient:
    """An async client of one generation's control plane (``url`` is its base URL)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        handoff_token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        try:
            base = httpx.URL(url)
        except httpx.InvalidURL:
            raise ConfigurationError(detail="the control URL is not a valid URL") from None
        if base.userinfo or base.query or base.fragment:
            raise ConfigurationError(
                detail="the control URL must not carry credentials, a query or a fragment; "
                "pass tokens separately"
            )
        if base.scheme not in ("http", "https") or not base.host or (base.port or 1) > 65535:
            raise ConfigurationError(detail=f"the control URL must be http(s)://host[:port]: {url}")
        self.url = str(base)
        self._tokens: dict[_Auth, str | None] = {"control": token, "handoff": handoff_token}
        self._retries = max(0, retries)
        self._http = httpx.AsyncClient(
            base_url=base,
            timeout=timeout,
            # A transport of the caller's brings its own TLS settings.
            transport=transport,
            trust_env=False,
            verify=tls_context() if transport is None else True,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # Drain.

    async def begin_drain(self, request: DrainRequest) -> Accepted:
        """Begin draining; an exact retry of the running drain answers ``duplicate=True``."""
        body = request.model_dump(mode="json")
        return await self._call(Accepted, "POST", paths.RUNTIME_DRAIN_BEGIN_PATH, json=body)

    async def drain_status(self, nonce: str) -> DrainStatus:
        params = {"nonce": nonce}
        return await self._call(DrainStatus, "GET", paths.RUNTIME_DRAIN_STATUS_PATH, params=params)

    async def current_drain(self) -> DrainStatus:
        """The running drain's status, nonce included (404 ``RUNTIME_DRAIN_NOT_FOUND`` if none).

        For an operator who lost the nonce: a hook that timed out, a CLI run elsewhere.
        """
        return await self._call(DrainStatus, "GET", paths.RUNTIME_DRAIN_CURRENT_PATH)

    async def wait_drained(
        self,
        nonce: str,
        *,
        on_progress: Callable[[DrainStatus], object] | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> DrainStatus:
        """Poll until the drain is drained, failed or rolled back; returns that status.

        ``on_progress`` sees every status polled, the final one included. Bound the wait with
        ``asyncio.timeout(...)``; giving up does not stop the drain.
        """
        return await self._wait(
            lambda: self.drain_status(nonce),
            lambda s: s.status in _FINAL_DRAIN,
            on_progress,
            poll_interval,
        )

    async def rollback(self, nonce: str) -> DrainStatus:
        """Return the generation to serving; the status then says ``rolled-back``."""
        body = {"nonce": nonce}
        return await self._call(DrainStatus, "POST", paths.RUNTIME_DRAIN_ROLLBACK_PATH, json=body)

    # Supervisor.

    async def reload(self) -> ReloadAccepted:
        """Ask a ``serve --workers`` supervisor to hand over to a new generation (as SIGHUP).

        Returns once the handover has begun, with its number for :meth:`wait_handover`; a
        handover or stop already running answers ``RUNTIME_RELOAD_BUSY`` (raised as a remote
        error).
        """
        return await self._call(
            ReloadAccepted, "POST", paths.RUNTIME_SUPERVISOR_RELOAD_PATH, json={}
        )

    async def handover_status(self, handover: int | None = None) -> HandoverStatus:
        """How handover ``handover`` (the number :meth:`reload` answered; None: the latest) is
        going: ``running``, ``done`` or ``aborted``."""
        params = None if handover is None else {"handover": str(handover)}
        return await self._call(
            HandoverStatus, "GET", paths.RUNTIME_SUPERVISOR_HANDOVER_PATH, params=params
        )

    async def wait_handover(
        self,
        handover: int,
        *,
        on_progress: Callable[[HandoverStatus], object] | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> HandoverStatus:
        """Poll until the handover is done or aborted (see :meth:`wait_drained`)."""
        return await self._wait(
            lambda: self.handover_status(handover),
            lambda s: s.state != "running",
            on_progress,
            poll_interval,
        )

    # State handoff.

    async def export_state(self, source_revision: str, target_revision: str) -> StateEnvelope:
        """Fetch the draining generation's envelope (needs the handoff token)."""
        params = {"sourceRevision": source_revision, "targetRevision": target_revision}
        return await self._call(
            StateEnvelope, "GET", paths.RUNTIME_STATE_EXPORT_PATH, params=params, auth="handoff"
        )

    async def begin_handoff(self, request: StateHandoffRequest, *, timeout_ms: int) -> Accepted:
        """Ask this (new) generation to fetch and import state from ``request.source``."""
        body = {**request.model_dump(mode="json"), "timeoutMs": timeout_ms}
        return await self._call(Accepted, "POST", paths.RUNTIME_STATE_BEGIN_PATH, json=body)

    async def handoff_status(self, nonce: str) -> StateHandoffStatus:
        params = {"nonce": nonce}
        return await self._call(
            StateHandoffStatus, "GET", paths.RUNTIME_STATE_STATUS_PATH, params=params
        )

    async def wait_handoff(
        self,
        nonce: str,
        *,
        on_progress: Callable[[StateHandoffStatus], object] | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> StateHandoffStatus:
        """Poll until the handoff is acknowledged or failed (see :meth:`wait_drained`)."""
        return await self._wait(
            lambda: self.handoff_status(nonce),
            lambda s: s.status in _FINAL_HANDOFF,
            on_progress,
            poll_interval,
        )

    # Probes.

    async def ready(self) -> bool:
        """True when the generation admits traffic (200), False while draining (503)."""
        response = await self._send("GET", paths.RUNTIME_READY_PATH, auth="none", accept=_NOT_READY)
        return response.status_code == 200

    async def live(self) -> bool:
        response = await self._send("GET", paths.RUNTIME_LIVE_PATH, auth="none")
        return response.status_code == 200

    # Plumbing.

    async def _wait(
        self,
        fetch: Callable[[], Coroutine[Any, Any, M]],
        done: Callable[[M], bool],
        on_progress: Callable[[M], object] | None,
        poll_interval: float,
    ) -> M:
        while True:
            status = await fetch()
            if on_progress is not None:
                on_progress(status)
            if done(status):
                return status
            await asyncio.sleep(poll_interval)

    async def _call(
        self,
        model: type[M],
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: object = None,
        auth: _Auth = "control",
    ) -> M:
        response = await self._send(method, path, params=params, json=json, auth=auth)
        try:
            return model.model_validate(orjson.loads(response.content))
        except (orjson.JSONDecodeError, ValidationError):
            raise RemoteError(
                "RUNTIME_RESPONSE_INVALID",
                detail=f"{method} {path} answered {response.status_code} with an unexpected body",
            ) from None

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: object = None,
        auth: _Auth,
        accept: frozenset[int] = frozenset(),
    ) -> httpx.Response:
        headers = {"Accept": "application/json"}
        if auth != "none":
            token = self._tokens[auth]
            if token is not None:
                headers["Authorization"] = f"Bearer {token}"
        content = None if json is None else orjson.dumps(json)
        if content is not None:
            headers["Content-Type"] = "application/json"
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    method, path.lstrip("/"), params=params, content=content, headers=headers
                )
            except httpx.TransportError as error:
                if attempt >= self._retries:
                    raise ControlUnreachableError(
                        detail=f"cannot reach {self.url} ({type(error).__name__}); "
                        "is the generation running and the URL right?"
                    ) from None
                logger.info(
                    "client.retry method=%s path=%s error=%s", method, path, type(error).__name__
                )
            else:
                if response.is_success or response.status_code in accept:
                    return response
                error_code, detail = _error_body(response)
                if error_code is not None:
                    raise error_for_code(error_code, detail)
                if response.status_code not in _GATEWAY_STATUSES or attempt >= self._retries:
                    raise RemoteError(
                        f"RUNTIME_HTTP_{response.status_code}",
                        detail=f"{method} {path} answered {response.status_code} without a "
                        "control-plane error body; is this the generation's control URL?",
                    )
                logger.info(
                    "client.retry method=%s path=%s status=%d", method, path, response.status_code
                )
            await asyncio.sleep(min(_BACKOFF_MAX, _BACKOFF_FIRST * 2**attempt))
            attempt += 1


def _error_body(response: httpx.Response) -> tuple[str | None, str | None]:
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return None, None
    if not isinstance(body, dict) or not isinstance(body.get("error"), str) or not body["error"]:
        return None, None
    detail = body.get("detail")
    return body["error"], detail if isinstance(detail, str) else None
