"""The generation-wide control paths (``serve --workers``): a worker checks them, the supervisor
answers them for the whole generation.

There is one control plane: :class:`~forgezero_lifecycle.asgi.control.ControlApp`. A worker
serves the generation-wide paths (:data:`~forgezero_lifecycle.asgi.control.GENERATION_PATHS`:
the drain paths, ``schedules``, ``metrics``, ``supervisor/v1/reload``,
``supervisor/v1/handover``, ``supervisor/v1/scale`` and ``supervisor/v1/status``) with the app its runtime built, made by
:meth:`~forgezero_lifecycle.asgi.control.ControlApp.for_generation`. So the token, the Host and
forwarding-header rules of ``--insecure-loopback-control``, the content type, the body's size and
time bounds and every error code are the single-process ones, applied in the worker before
anything crosses the channel. What crosses it is one small typed call::

    {"op": "control", "call": "drain.status", "args": {"nonce": "..."}}

answered by :class:`ForwardedControl`, in the supervisor, one per generation, with
``{"status", "headers", "body"}`` (``body`` a JSON value: an object, or the text of a metrics
scrape). A supervisor that does not answer in time is a 503 ``RUNTIME_SUPERVISOR_UNAVAILABLE``.

The answers: the drain calls from the generation's drain controller, with the per-worker picture
in ``detail`` (``status`` and ``rollback`` from whichever generation the supervisor still knows
holds the nonce, and a ``begin`` reaching a generation that a handover is retiring refused with
``RUNTIME_DRAIN_GENERATION_RETIRING``, as docs/serve.md says); ``schedules`` and ``metrics`` from every worker, labelled with its worker (and the supervisor's own counters after them);
``reload`` begins a handover and answers with its number; ``handover`` from the supervisor's
record (:mod:`.handovers`); ``scale`` adds or removes one worker and answers the size;
``status`` is the supervisor's own (its workers, replacements and unresponsive workers). A metrics scrape needs no token, so the supervisor fans one out to
the workers at a time and reuses its merged scrape for :data:`METRICS_REUSE` seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Protocol, final

import orjson

from .._clock import Clock, SystemClock
from .._errors import (
    ControlPathNotFoundError,
    DrainConflictError,
    DrainNotFoundError,
    DrainRequestInvalidError,
    LifecycleError,
    ReloadBusyError,
    ScaleRefusedError,
)
from ..asgi._paths import app_path
from ..asgi._types import ASGIApp, Receive, Scope, Send
from ..asgi.control import GENERATION_PATHS, Answer, ControlApp, error_answer
from ..core.drain import DrainController
from ..wire.supervisor import ReloadAccepted, ScaleAccepted
from .channel import Channel, ChannelClosedError
from .handovers import HandoverLog

__all__ = ["FORWARD_TIMEOUT", "METRICS_REUSE", "ForwardedControl", "GenerationControl"]

#: How long a worker waits for the supervisor's answer to one call.
FORWARD_TIMEOUT: Final = 30.0
#: How long a generation's merged metrics scrape is reused (a scrape of 3,000 requests cost
#: the supervisor 6 s of CPU when each one asked every worker).
METRICS_REUSE: Final = 1.0
_UNAVAILABLE: Final = Answer(
    503,
    b'{"error":"RUNTIME_SUPERVISOR_UNAVAILABLE",'
    b'"detail":"the supervisor did not answer; try again"}',
)


# The worker's end.


@final
class GenerationControl:
    """Pure ASGI, in a worker: the generation-wide control paths go to ``control`` made for the
    generation (checked here, answered by the supervisor), everything else to ``app``."""

    def __init__(self, app: ASGIApp, /, *, channel: Channel, control: ControlApp) -> None:
        self.app = app
        self._channel = channel
        self._control = control.for_generation(self._call)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and app_path(scope).rstrip("/") in GENERATION_PATHS:
            await self._control(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _call(self, call: str, arguments: dict[str, object]) -> Answer:
        try:
            found = await self._channel.request(
                "control", timeout=FORWARD_TIMEOUT, call=call, args=arguments
            )
        except (ChannelClosedError, TimeoutError):
            return _UNAVAILABLE
        return _answer_from_wire(found)


def _answer_from_wire(found: Mapping[str, Any]) -> Answer:
    headers = {str(k).lower(): str(v) for k, v in found.get("headers", ())}
    content_type = headers.pop("content-type", "application/json")
    body = found.get("body")
    encoded = body.encode() if isinstance(body, str) else orjson.dumps(body)
    return Answer(int(found.get("status", 500)), encoded, content_type, tuple(headers.items()))


# The supervisor's end.


class _Worker(Protocol):
    """What the answers need of a worker (the supervisor's handle on it)."""

    @property
    def index(self) -> int: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def exited(self) -> asyncio.Event: ...
    def command(self, op: str, **fields: Any) -> Awaitable[dict[str, Any]]: ...


class _Generation(Protocol):
    """What the answers need of a generation."""

    @property
    def number(self) -> int: ...
    @property
    def controller(self) -> DrainController: ...
    @property
    def workers(self) -> Sequence[_Worker]: ...
    def detail(self) -> dict[str, Any]: ...
    def acknowledged(self) -> Awaitable[None]: ...


#: A call's answer before it goes on the channel: status, body (a JSON value), extra headers.
_Reply = tuple[int, object, list[tuple[str, str]]]


@final
class ForwardedControl:
    """One generation's answers, in the supervisor, to the calls its workers hand on."""

    def __init__(
        self,
        generation: _Generation,
        *,
        on_reload: Callable[[], int | str],
        on_scale: Callable[[int], int | str],
        status: Callable[[], dict[str, Any]],
        exposition: Callable[[], str],
        handovers: HandoverLog,
        serving: Callable[[], _Generation | None],
        known: Callable[[], Sequence[_Generation]],
        clock: Clock | None = None,
    ) -> None:
        """``serving``: the generation the supervisor hands the port to (a begin reaching
        another one is refused); ``known``: every generation it still knows (a drain's nonce
        is answered by whichever of them holds it); ``clock``: the metrics scrape's reuse."""
        self._generation = generation
        self._serving = serving
        self._known = known
        self._clock = clock or SystemClock()
        #: The last merged scrape (None: no worker serves metrics) and when it was begun.
        self._scraped: tuple[float, str | None] | None = None
        self._scraping = asyncio.Lock()  # one fan-out at a time; the others wait and reuse it
        self._on_reload = on_reload
        self._on_scale = on_scale
        self._status_of_supervisor = status
        self._exposition = exposition
        self._handovers = handovers
        self._calls: Mapping[str, Callable[[Mapping[str, object]], Awaitable[_Reply]]] = {
            "drain.begin": self._begin,
            "drain.status": self._status,
            "drain.current": self._current,
            "drain.rollback": self._rollback,
            "schedules": self._schedules,
            "metrics": self._metrics,
            "reload": self._reload,
            "handover": self._handover,
            "scale": self._scale,
            "status": self._supervisor,
        }

    async def answer(self, call: str, arguments: Mapping[str, object]) -> dict[str, Any]:
        """The channel answer (``{"status", "headers", "body"}``) to one call from a worker."""
        handler = self._calls.get(call)
        try:
            if handler is None:
                raise ControlPathNotFoundError(detail=f"no generation-wide call {call!r}")
            status, body, headers = await handler(arguments)
        except LifecycleError as error:
            refused = error_answer(error)
            status, body = refused.status, orjson.loads(refused.body)
            headers = list(refused.headers)
        return {
            "status": status,
            "headers": [["cache-control", "no-store"], *map(list, headers)],
            "body": body,
        }

    # The drain, for the whole generation.

    async def _begin(self, arguments: Mapping[str, object]) -> _Reply:
        serving = self._serving()
        if serving is not None and serving is not self._generation:
            # A request in flight on an old worker's connection when the handover switched:
            # a drain here would drain only what is retiring, and report it drained.
            raise DrainConflictError(
                "RUNTIME_DRAIN_GENERATION_RETIRING",
                detail=f"generation {self._generation.number} is retiring: a handover gave "
                f"the port to generation {serving.number}; send the begin again on a new "
                "connection",
            )
        accepted = self._generation.controller.begin(arguments.get("request"))
        await self._generation.acknowledged()
        return 202, accepted.model_dump(), []

    async def _status(self, arguments: Mapping[str, object]) -> _Reply:
        nonce = _nonce(arguments)
        generation = self._holding(nonce)
        await _refresh(generation)
        return _with_detail(generation, generation.controller.status(nonce))

    async def _current(self, arguments: Mapping[str, object]) -> _Reply:
        await _refresh(self._generation)
        return _with_detail(self._generation, self._generation.controller.current())

    async def _rollback(self, arguments: Mapping[str, object]) -> _Reply:
        nonce = _nonce(arguments)
        generation = self._holding(nonce)
        status = generation.controller.rollback(nonce)
        await generation.acknowledged()
        return _with_detail(generation, status)

    def _holding(self, nonce: str) -> _Generation:
        """The generation whose drain has ``nonce``: this one, or another the supervisor still
        knows (a drain of the old generation, polled through a new worker after the switch)."""
        for generation in (self._generation, *self._known()):
            try:
                generation.controller.status(nonce)
            except DrainNotFoundError:
                continue
            return generation
        return self._generation  # its controller answers the 404

    def _live(self) -> list[_Worker]:
        return _live(self._generation)

    # The rest of the generation-wide paths.

    async def _schedules(self, arguments: Mapping[str, object]) -> _Reply:
        workers = self._live()
        answers = await asyncio.gather(*(worker.command("schedules") for worker in workers))
        schedules = [
            {**entry, "worker": worker.index, "pid": worker.pid}
            for worker, answer in zip(workers, answers, strict=True)
            for entry in answer.get("schedules", [])
        ]
        return 200, {"schedules": schedules}, []

    async def _metrics(self, arguments: Mapping[str, object]) -> _Reply:
        """Every worker's scrape, labelled with its worker (opt-in, no token), at most
        :data:`METRICS_REUSE` seconds old."""
        async with self._scraping:
            if self._scraped is None or self._clock.monotonic() - self._scraped[0] >= METRICS_REUSE:
                begun = self._clock.monotonic()
                self._scraped = (begun, await self._scrape())
            text = self._scraped[1]
        if text is None:  # the app serves no metrics: the path is unknown, as in one process
            raise ControlPathNotFoundError(detail="no such control path")
        from prometheus_client import CONTENT_TYPE_LATEST

        return 200, "" if arguments.get("head") else text, [("content-type", CONTENT_TYPE_LATEST)]

    async def _scrape(self) -> str | None:
        workers = self._live()
        answers = await asyncio.gather(*(worker.command("metrics") for worker in workers))
        scraped = [
            ({"worker": str(worker.index), "pid": str(worker.pid)}, answer["text"].encode())
            for worker, answer in zip(workers, answers, strict=True)
            if isinstance(answer.get("text"), str)
        ]
        if not scraped:
            return None
        from ..metrics import merge_expositions

        return merge_expositions(scraped).decode() + self._exposition()

    async def _reload(self, arguments: Mapping[str, object]) -> _Reply:
        number = self._on_reload()
        if isinstance(number, str):
            raise ReloadBusyError(detail=f"{number}; try again once it is done")
        return 202, ReloadAccepted(handover=number).model_dump(mode="json"), []

    async def _scale(self, arguments: Mapping[str, object]) -> _Reply:
        by = arguments.get("by")
        if by not in (1, -1) or isinstance(by, bool) or not isinstance(by, int):
            raise DrainRequestInvalidError(detail='the body of a scale is {"by": 1} or {"by": -1}')
        workers = self._on_scale(by)
        if isinstance(workers, str):
            raise ScaleRefusedError(detail=workers)
        return 202, ScaleAccepted(workers=workers).model_dump(mode="json"), []

    async def _supervisor(self, arguments: Mapping[str, object]) -> _Reply:
        return 200, self._status_of_supervisor(), []

    async def _handover(self, arguments: Mapping[str, object]) -> _Reply:
        number = arguments.get("number")
        if number is not None and not isinstance(number, int):
            raise DrainRequestInvalidError(detail="a handover number is a whole number")
        handover = self._handovers.find(number)
        if handover is None:
            detail = (
                "no handover has begun"
                if number is None
                else "no handover with this number (give the number reload answered)"
            )
            raise ControlPathNotFoundError(detail=detail)
        return 200, handover.wire(), []


def _live(generation: _Generation) -> list[_Worker]:
    return [worker for worker in generation.workers if not worker.exited.is_set()]


async def _refresh(generation: _Generation) -> None:
    """Fresh counters from every worker of ``generation`` (each bounded by the command timeout)."""
    await asyncio.gather(*(worker.command("status") for worker in _live(generation)))


def _with_detail(generation: _Generation, status: Any) -> _Reply:
    document = status.model_dump(mode="json", exclude_none=True)
    document["detail"] = generation.detail()
    return 200, document, []


def _nonce(arguments: Mapping[str, object]) -> str:
    nonce = arguments.get("nonce")
    if not isinstance(nonce, str):
        raise DrainNotFoundError(detail="the nonce query parameter is required")
    return nonce
