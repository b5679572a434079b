"""Pure-ASGI in-flight middleware: counts, refuses and ends work as the intake gate says.

Per connection, by ``scope["type"]``:

* ``lifespan`` passes through, with the runtime's signal hook
  (:mod:`forgezero_lifecycle.core.signal_drain`) installed at startup and put back at shutdown
  (on the first request instead when the server runs without lifespan);
* control-plane paths (``/.forgezero/runtime/…``, after ``root_path``) go to the control app,
  ahead of every user route and middleware, and are neither counted nor refused; so are scopes
  the user's ``exempt`` predicate picks;
* ``http``: admitted and counted until the app call returns (streamed bodies and background
  tasks included), or refused with a 503 the app never sees. While draining, every response
  start gains ``Connection: close`` (over HTTP/1: HTTP/2 and HTTP/3 forbid the header, and a
  refusal over them goes without it too). Once the stream grace is over, a request that waits on
  ``receive()`` after its body gets ``http.disconnect``, and a response the app then leaves
  unfinished is cut so that the client can tell (connection aborted, or HTTP/2 stream reset;
  docs/long-lived-work.md), never ended cleanly;
* ``websocket``: admitted and counted, or refused before accept (503 denial response when the
  server offers ``websocket.http.response``, else close 1013). Once the stream grace is over an
  open session is closed with 1012 (configurable) and reason ``draining``; the server then
  delivers ``websocket.disconnect`` to the app, and an app send after that raises
  :class:`~forgezero_lifecycle.ConnectionClosedByDrainError` (an ``OSError``, as the ASGI spec wants
  for a send on a closed connection), so a handler that only sends ends too. A denial the app
  sends (``websocket.http.response.start`` and its body parts) ends with its last body part
  (``more_body`` false); the notice never closes a session in the middle of one.

Every admitted HTTP and WebSocket scope carries the drain notice,
``scope["extensions"]["forgezero.drain"]`` (:mod:`._notice`): a handler that waits on it is told
at its instant through it alone, and is ended by the drain only at the cutoff. The app's
lifespan runs under the teardown (:mod:`._teardown`), so a stop the runtime owns can shut it
down right after the drain, within its bound.

Every send made while draining is bounded by the gate's ``cutoff`` (set by the runtime at the
drain's release margin): a send still blocked then by a client that does not read is given up,
raises ``ConnectionClosedByDrainError`` (``RUNTIME_DRAIN_CONNECTION_ABANDONED``) and the connection is
abandoned: the middleware returns, the server closes it, and the count is released in time.
What the app raises because of the drain's own ``ConnectionClosedByDrainError`` is not passed on.
A wrapped request's send made before the drain began is the server's own coroutine, handed to
the app as it is (no frame of the middleware's around it); if it is still blocked at the cutoff,
the task blocked in it (found by its chain of awaits, so an app waiting on anything else is never
touched) is cancelled instead: the app sees ``asyncio.CancelledError`` there, and the middleware
takes that cancel back (``Task.uncancel``) and returns as for an abandoned send, unless somebody
else, the server say, cancelled the request too: then the ``CancelledError`` is passed on.

A WebSocket session's sends are bounded the same way, whenever they began: one made while
draining gives itself up at the cutoff, one made before is the server's own coroutine, whose
blocked task the cutoff cancels. The close notice waits for a send in progress only until the
cutoff. A session still running at the cutoff is abandoned (``drain.connection_abandoned
kind=websocket``, once) and its connection aborted; one the drain closed with 1012 has
:data:`CLOSE_HANDSHAKE_TIMEOUT` seconds after its app returned for the close handshake, then its
connection is aborted too. The server's own close waits until a connection's write buffer is
flushed, which a client that never reads never lets happen: this keeps such a client from
holding the server's stop (uvicorn's WebSocket protocols and hypercorn's over HTTP/1; under
another server a log line says the connection is left to it).

Under hypercorn, each HTTP/2 connection seen is sent GOAWAY at the drain's first instant and
again, the final one, once intake closed, then closed; a busy connection is told once its last
stream is done, and a stream opened after the GOAWAY is refused unprocessed
(:mod:`forgezero_lifecycle.asgi._hypercorn`; docs/streams.md says why the GOAWAY names the last
stream taken in, not the largest id).

Under uvicorn, and under hypercorn for HTTP/1, a request admitted while no drain has begun is
not wrapped at all: it gets the server's own ``receive`` and ``send``, and the drain acts on
uvicorn's request cycle (:mod:`forgezero_lifecycle.asgi._uvicorn`) or hypercorn's stream
(:mod:`forgezero_lifecycle.asgi._hypercorn`) instead, from its first instant; the guarantees
above hold for it too. Every other request (admitted during a drain, HTTP/2, or under another
server) goes through a per-request responder that does the same on the messages.

No per-request state lives on ``self`` but the running uvicorn cycles and hypercorn streams a
drain acts on (:mod:`._running`: a uvicorn request is named by its connection's drain notice,
lent to it while it runs), and the set of running wrapped requests the cutoff looks through;
everything else per request is a local or a closure. A status names the oldest of them from
these alone (:mod:`._in_flight`): the request path records nothing more for it.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable
from time import monotonic as _now
from types import CoroutineType, FrameType
from typing import Any, Final, final

from .._errors import ConnectionClosedByDrainError
from .._race import first
from ..core.gate import DrainMoment, IntakeGate
from ..core.signal_drain import SignalDrain
from ..wire._protocol import REFUSAL_BODY
from ..wire.paths import CONTROL_PREFIX
from . import _hypercorn
from ._blocked import tasks_blocked_in
from ._body import discard_body
from ._drain_messages import ABANDONED_CODE, CLOSE_HEADER, abandoned, response_cut
from ._hypercorn import HTTP1, KNOWN_STREAMS, DrainSend
from ._in_flight import InFlightItem, oldest
from ._notice import EXTENSION, DrainNotice, Listener, NoticeBoard
from ._paths import app_path
from ._running import RunningRequests
from ._teardown import Teardown
from ._types import ASGIApp, Message, Receive, Scope, Send
from ._uvicorn import (
    KNOWN_CYCLES,
    act,
    call_directly,
    cut,
    cut_response,
    given_up,
    learn,
    reconnect,
    settle,
    websocket_transport,
)

__all__ = ["InFlightMiddleware"]

logger = logging.getLogger("forgezero_lifecycle.middleware")

_new = object.__new__
_DISCONNECT: Final = {"type": "http.disconnect"}
_TRY_AGAIN_LATER: Final = 1013
_CLOSED: Final = "RUNTIME_DRAIN_CONNECTION_CLOSED"
#: Seconds a WebSocket the drain closed (1012) has for its close handshake once its app
#: returned; then its connection is aborted (:func:`_end_connection`).
CLOSE_HANDSHAKE_TIMEOUT: Final = 2.0
#: How often a connection waiting for its GOAWAY is looked at, until its last stream is done.
_H2_IDLE_CHECK: Final = 0.05
#: HTTP versions whose responses must not carry ``connection`` (RFC 9113 8.2.2, RFC 9114 4.2).
_NO_CONNECTION_HEADER: Final = frozenset({"2", "3"})


@final
class InFlightMiddleware:
    """Wrap an ASGI app so the runtime's drain can see, refuse and end its work."""

    #: The runtime that built this middleware (set by ``Runtime.wrap``), for tools such as
    #: ``forgezero-lifecycle serve`` that are handed the wrapped app.
    forgezero_runtime: object | None = None

    def __init__(
        self,
        app: ASGIApp,
        /,
        *,
        gate: IntakeGate,
        control: ASGIApp | None = None,
        exempt: Callable[[Scope], bool] | None = None,
        retry_after: int = 1,
        websocket_close_code: int = 1012,
        signals: SignalDrain | None = None,
        notice_spread: float = 0.0,
        notice_room: Callable[[], float] | None = None,
        teardown: Teardown | None = None,
    ) -> None:
        self.app = app
        #: Seconds over which the stream notice reaches the sessions and requests running at
        #: it, each at its own instant (0: all at once), and how long is left until the cutoff
        #: when the notice comes (the window is at most half of it; None: no limit).
        self._notice_spread = notice_spread
        self._notice_room = notice_room
        #: What every request's ``scope["extensions"]["forgezero.drain"]`` reads (:mod:`._notice`).
        self._board = NoticeBoard(gate, notice_room)
        self._notice_kind = self._board.kind
        self._signals = signals
        #: Runs the app's lifespan so the stop can shut it down right after the drain.
        self._teardown = teardown
        self._gate = gate
        self._control = control
        self._exempt = exempt
        self._close_code = websocket_close_code
        #: uvicorn request cycles and hypercorn streams admitted while serving and still running
        #: (asgi._uvicorn, asgi._hypercorn): the gate counts them as admitted HTTP requests.
        self._running = RunningRequests()
        gate.count_running(self._running)
        #: The wrapped requests running now, for the cutoff to find a send of theirs that was
        #: blocked before the drain began (:mod:`._blocked`).
        self._wrapped: set[_HttpResponder] = set()
        #: The WebSocket sessions running now, for the same (a send of theirs made before the
        #: drain and still blocked at the cutoff).
        self._sessions: set[_WebSocketSession] = set()
        #: hypercorn's HTTP/2 connections seen (one request of theirs at least: an app's, a
        #: control or an exempt one), for the GOAWAY a drain sends at its first instant and once
        #: intake closed; and those with streams still running then, with the GOAWAY each waits
        #: to be sent (True: the final one).
        self._h2: weakref.WeakSet[Any] = weakref.WeakSet()
        self._h2_waiting: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
        #: The last stream id each connection's GOAWAY named: a later stream is not processed.
        self._h2_last: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        #: Whether an HTTP or WebSocket scope must be screened in full before it is counted: with
        #: an exempt predicate, or while the signal hook waits for a first request to install it
        #: (:attr:`SignalDrain.pending <forgezero_lifecycle.core.signal_drain.SignalDrain>`
        #: turns true again only when a lifespan here ends without a shutdown, see _lifespan);
        #: and until the first call, which looks once at who calls this middleware (_route).
        self._screen = True
        self._caller_seen = False
        #: The class of the last uvicorn cycle seen, of the last hypercorn stream, and of the last
        #: ``send.__self__`` that was neither: a few identity tests per request.
        self._cycle_kind: type | None = None
        self._stream_kind: type | None = None
        self._other_kind: type | None = None
        gate.watch(self._at_drain_moment)
        if signals is not None:
            signals.when_forced(self._cut_running)
        #: The refusal's headers over HTTP/2 and HTTP/3, where ``connection`` is forbidden, and
        #: over HTTP/1 (the same, with Connection: close).
        self._refusal_headers_h2: Final = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(REFUSAL_BODY)).encode()),
            (b"retry-after", str(retry_after).encode()),
        ]
        self._refusal_headers: Final = [*self._refusal_headers_h2, CLOSE_HEADER]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The hot path, kept flat and small since it runs on every request: an HTTP request
        # that no setting sends elsewhere costs three tests before it is counted. Under uvicorn
        # while no drain runs, counting it is its notice's owner set and cleared and nothing
        # else is done to it; under hypercorn over HTTP/1, its stream added to and discarded
        # from a set. Every other counted request goes through _counted (a coroutine of its
        # own: those paths are not paid for by these).
        # The control prefix is looked for anywhere in the path: the path inside the app is a
        # suffix of scope["path"] (ASGI 3 puts root_path in both), so a path without it is no
        # control path whatever root_path says, and one with it is screened in full by _route.
        if scope["type"] != "http" or self._screen or CONTROL_PREFIX in scope["path"]:
            elsewhere = self._route(scope)
            if elsewhere is not None:
                if scope["type"] == "http" and scope.get("http_version") == "2":
                    # A control or exempt request: never refused, but its connection is one
                    # a drain must tell to go (a prober's, say, that carries nothing else).
                    self._past_goaway(send)
                await elsewhere(scope, receive, send)
                return
        # Under uvicorn, while serving: the server's own receive and send, counted among the
        # running requests that each drain moment acts on (asgi._uvicorn, asgi._running);
        # counted in the same synchronous step as the test of gate.serving, so a drain that
        # begins later finds this request.
        gate = self._gate
        try:
            cycle = send.__self__  # type: ignore[attr-defined]  # a bound method's object
        except AttributeError:  # no method: no server's request the drain can act on
            cycle = None
        kind = type(cycle)
        if gate.serving and (
            kind is self._cycle_kind
            or (
                kind is not self._other_kind
                and kind is not self._stream_kind
                and self._is_cycle(cycle)
            )
        ):
            # The drain notice (asgi._notice): the connection's own, made at its first request
            # and lent to each request in turn, in extensions of the request's own (uvicorn's
            # scope has none); a request that finds it lent (the last one still running) or
            # the scope with extensions gets a notice of its own (_own_notice). The notice's
            # owner is what counts the request (asgi._running), set here in the same step as
            # the test of gate.serving and cleared as it ends.
            try:
                notice = cycle.flow.forgezero_notice
            except AttributeError:
                notice = self._connection_notice(cycle)
            if notice._owner is None and "extensions" not in scope:
                scope["extensions"] = {EXTENSION: notice}
            else:
                notice = self._own_notice(scope)
            notice._owner = cycle
            try:
                await self.app(scope, receive, send)
            except Exception as error:
                if gate.draining and _uvicorn_gave_up(cycle, error):
                    return
                raise
            else:
                if gate.draining:
                    settle(cycle)
            finally:
                # Released; and the scope holds the notice and the cycle the scope: letting go
                # of the cycle frees the request's objects as it ends, not by the collector.
                notice._owner = None
                if gate.waiting_idle:
                    gate.released()
            return
        # Under hypercorn, an HTTP/1 request while serving: the same as uvicorn's, on
        # hypercorn's HTTPStream (asgi._hypercorn), counted as a member of the running set;
        # HTTP/2 streams share a connection and are wrapped.
        if gate.serving and kind is self._stream_kind and scope["http_version"] in HTTP1:
            running = self._running.members
            running.add(cycle)
            notice = _new(self._notice_kind)
            notice._owner = cycle
            extensions = scope.get("extensions")
            if extensions is None:
                scope["extensions"] = {EXTENSION: notice}
            else:  # hypercorn's own (every version this path knows gives one)
                extensions[EXTENSION] = notice
            try:
                await self.app(scope, receive, send)
            except Exception as error:
                if not (gate.draining and _hypercorn.given_up(cycle) and _caused_by_drain(error)):
                    raise
            else:
                if gate.draining:
                    _hypercorn.settle(cycle)
            finally:
                notice._owner = None  # as under uvicorn: no stream through the scope
                running.discard(cycle)
                if type(cycle.send) is DrainSend:
                    _hypercorn.release(cycle)
                if gate.waiting_idle:
                    gate.released()
            return
        await self._counted(scope, receive, send)

    async def _counted(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A counted HTTP request that is not the server's own while serving (admitted while
        draining, HTTP/2, another server): counted by the gate and wrapped, or refused."""
        gate = self._gate
        if scope.get("http_version") == "2" and self._past_goaway(send):
            gate.refused_http += 1
            await self._refuse_http(scope, receive, send)
            return
        if not gate.admit_http():
            gate.refused_http += 1
            await self._refuse_http(scope, receive, send)
            return
        responder = _HttpResponder(gate, receive, send, scope)
        notice = self._board.notice(responder)
        _offer(scope, notice)
        wrapped = self._wrapped
        wrapped.add(responder)
        try:
            await self.app(scope, responder.receive, responder.send)
            if responder.cut_short and not cut_response(send):
                # A server the middleware cannot end a response under: the ASGI way to say a
                # response is broken, which every server answers by closing the connection.
                raise response_cut()
        except Exception as error:
            if not (responder.abandoned and _caused_by_drain(error)):
                raise
            # Given up: return without finishing the response, so the server closes it.
        except asyncio.CancelledError:
            if not responder.forgive_cancel():
                raise  # cancelled by somebody else too (the server, say): that stands
            # A send blocked since before the drain, cancelled at the cutoff: given up as above.
        finally:
            notice._owner = None  # as under uvicorn: no cycle through the scope
            wrapped.discard(responder)
            if responder.cancelled is not None:
                responder.forgive_cancel()  # the app swallowed the cutoff's CancelledError
            gate.release_http()

    def _connection_notice(self, cycle: Any) -> DrainNotice:
        """The notice of ``cycle``'s connection, made at its first request and kept on its
        flow control (one per connection, as the flow control is)."""
        notice = _new(self._notice_kind)
        notice._owner = None
        try:
            cycle.flow.forgezero_notice = notice
        except (AttributeError, TypeError):  # a flow control that takes no attribute
            self._running.lend(notice, own=True)  # this request's alone, as the next one's
            return notice
        self._running.lend(notice)
        return notice

    def _own_notice(self, scope: Scope) -> DrainNotice:
        """A notice of its own, offered in its scope, for a request under uvicorn whose
        connection's notice is lent to a request still running (or whose scope has extensions
        already); counted as the connection's are."""
        notice = _new(self._notice_kind)
        notice._owner = None
        self._running.lend(notice, own=True)
        _offer(scope, notice)
        return notice

    def oldest_in_flight(self, limit: int) -> list[InFlightItem]:
        """The ``limit`` oldest requests and sessions running now, oldest first (what a
        drain waits for, as its status ``detail`` names it: :mod:`._in_flight`)."""
        return oldest(self._running, self._wrapped, self._sessions, limit)

    def _route(self, scope: Scope) -> ASGIApp | None:
        """Where a scope the hot path did not take goes: an app to hand it to, or None for the
        counted HTTP path."""
        if not self._caller_seen:
            # Once per app: uvicorn's own wrapper calls this instance through its ``app``
            # attribute; given the bound method, each request skips the lookup of __call__.
            self._caller_seen = True
            call_directly(_caller_of_call(), self)
        kind = scope["type"]
        if kind == "lifespan":
            if self._signals is None and self._teardown is None:
                return self.app
            return self._lifespan
        if kind != "http" and kind != "websocket":
            return self.app
        signals = self._signals
        if signals is not None and signals.pending:
            signals.install()  # the server runs without lifespan: hook on the first request
        self._screen = self._exempt is not None or (signals is not None and signals.pending)
        if app_path(scope).startswith(CONTROL_PREFIX):
            return self._control or self.app
        if self._exempt is not None and self._exempt(scope):
            return self.app
        if kind == "websocket":
            return self._websocket
        return None

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app's lifespan with the signal hook around it (installed at startup, the
        server's handlers are in place by then; put back as soon as ``lifespan.shutdown``
        arrives), run by the teardown (:mod:`._teardown`), which the stop uses to shut the app
        down right after the drain."""
        signals = self._signals
        teardown = self._teardown
        if signals is not None:
            signals.install()
        shutting_down = False

        async def receive_watching_shutdown() -> Message:
            nonlocal shutting_down
            message = await (receive() if teardown is None else teardown.receive(receive))
            if message["type"] == "lifespan.shutdown":
                shutting_down = True
                # The teardown's own shutdown comes from the signal hook's stop, which runs on:
                # the hook is put back once the server's own shutdown came (below).
                if signals is not None and (teardown is None or not teardown.requested):
                    signals.uninstall()
            return message

        async def send_watching_shutdown(message: Message) -> None:
            if teardown is None or not teardown.sent(message):
                await send(message)

        try:
            if teardown is None:
                await self.app(scope, receive_watching_shutdown, send)
            else:
                app_call = self.app(scope, receive_watching_shutdown, send_watching_shutdown)
                await teardown.run(app_call, receive, send)
        finally:
            if signals is not None:
                # Without a shutdown the app does not speak lifespan: the first request tries
                # again.
                signals.uninstall(final=shutting_down)
                if signals.pending:
                    self._screen = True

    async def _refuse_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        await discard_body(scope, receive)
        headers = (
            self._refusal_headers_h2
            if scope.get("http_version") in _NO_CONNECTION_HEADER
            else self._refusal_headers
        )
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": REFUSAL_BODY})

    def _is_cycle(self, cycle: object) -> bool:
        """Whether ``cycle`` (``send.__self__``) is a uvicorn request cycle; remembers its class,
        and that of a hypercorn stream (for which this is False)."""
        kind = type(cycle)
        known = KNOWN_CYCLES.get(kind)
        if known is None:
            known = learn(cycle)
        if known:
            self._cycle_kind = kind
            return True
        stream = KNOWN_STREAMS.get(kind)
        if stream is None:
            stream = _hypercorn.learn(cycle)
        if stream:
            self._stream_kind = kind
        else:
            self._other_kind = kind
        return False

    def _past_goaway(self, send: Send) -> bool:
        """Note the HTTP/2 connection of a request under hypercorn, whatever the request (one
        first seen while draining is told GOAWAY once this request is done); True when the
        request's stream came after the GOAWAY sent on it, which said such a stream is not
        processed (the client retries it elsewhere): a counted request then gets the refusal,
        and the app never sees it."""
        try:
            protocol = _hypercorn.h2_connection(send)
            if protocol is None:
                return False
            last = self._h2_last.get(protocol)
            if last is not None:
                return _hypercorn.stream_id(send) > last
            if protocol not in self._h2:
                self._h2.add(protocol)
                if self._gate.draining:
                    self._goaway_when_idle(protocol, final=not self._gate.is_open)
        except Exception:  # a server that changed under us: log, never fail the request
            logger.exception("drain.h2_goaway_failed")
        return False

    def _goaway(self, moment: DrainMoment) -> None:
        """GOAWAY on every HTTP/2 connection seen: the first at the drain's first instant, the
        final one once intake closed (after the not-ready grace)."""
        for protocol in list(self._h2):
            try:
                self._goaway_when_idle(protocol, final=moment == "closed")
            except Exception:  # a server that changed under us: log, never stop the drain
                logger.exception("drain.h2_goaway_failed moment=%s", moment)

    def _goaway_when_idle(self, protocol: Any, *, final: bool) -> None:
        """Send the GOAWAY now if the connection has no stream running, else once its last one
        is done: Python's h2 (httpx's HTTP/2) fails every stream still open on a connection
        that received a GOAWAY, whatever its last stream id, so a busy one is told after."""
        if _hypercorn.h2_idle(protocol):
            self._send_goaway(protocol, final=final)
            self._h2_waiting.pop(protocol, None)
            return
        if not self._h2_waiting:
            asyncio.get_running_loop().call_later(_H2_IDLE_CHECK, self._goaway_waiting)
        self._h2_waiting[protocol] = final or self._h2_waiting.get(protocol, False)

    def _send_goaway(self, protocol: Any, *, final: bool) -> None:
        last = _hypercorn.goaway(protocol, final=final)
        if last is not None:
            self._h2_last[protocol] = last

    def _goaway_waiting(self) -> None:
        """Send each waiting GOAWAY whose connection has become idle (looked at every
        _H2_IDLE_CHECK seconds while one waits: hypercorn tells nobody)."""
        for protocol, closing in list(self._h2_waiting.items()):
            try:
                if _hypercorn.h2_idle(protocol):
                    del self._h2_waiting[protocol]
                    self._send_goaway(protocol, final=closing)
            except Exception:
                self._h2_waiting.pop(protocol, None)
                logger.exception("drain.h2_goaway_failed")
        if self._h2_waiting:
            asyncio.get_running_loop().call_later(_H2_IDLE_CHECK, self._goaway_waiting)

    def _at_drain_moment(self, moment: DrainMoment) -> None:
        if moment == "draining" or moment == "closed":
            if self._h2:
                self._goaway(moment)
            if moment == "closed":
                return
        if moment == "notice" and self._notice_spread > 0:
            self._spread_notice()
            return
        listening = self._board.listening
        if moment == "cutoff" and (self._wrapped or self._sessions):
            # A wrapped send made before the drain is the server's own, handed to the app as it
            # is: the task still blocked in one is cancelled (a send made since bounds itself).
            try:
                sends: list[tuple[_HttpResponder | _WebSocketSession, Any]] = [
                    (responder, responder.sending) for responder in self._wrapped
                ]
                sends.extend((session, session.sending) for session in self._sessions)
                for owner, task in tasks_blocked_in(sends):
                    owner.give_up(task)
                # A session the drain (or its app) closed and still running now is held by a
                # client that does not answer the close: its connection is abandoned, so its
                # app's receive() and send() end and the count is released in time. One not
                # told yet (its instant in the spread still ahead) is closed now by its watcher.
                for session in self._sessions:
                    if session.ended is not None or session.app_closed:
                        session.abandon_connection()
            except Exception:  # never stop the drain
                logger.exception("drain.server_request_failed moment=%s", moment)
        for cycle in list(self._running):
            if moment == "notice" and cycle in listening:
                continue  # its handler waits on the notice: it ends itself, or at the cutoff
            try:
                if KNOWN_STREAMS.get(type(cycle)):
                    _hypercorn.act(moment, cycle)
                else:
                    act(moment, cycle)
            except Exception:  # a server that changed under us: log, never stop the drain
                logger.exception("drain.server_request_failed moment=%s", moment)

    def _cut_running(self) -> None:
        """A second signal forced the server's stop: abort the connection of every request of
        the server's own still running here (wrapped ones are left to the server's stop)."""
        for cycle in list(self._running):
            try:
                if KNOWN_STREAMS.get(type(cycle)):
                    _hypercorn.cut(cycle)
                else:
                    cut(cycle)
            except Exception:  # a server that changed under us: its own stop goes on
                logger.exception("drain.server_request_failed moment=forced")

    def _spread_notice(self) -> None:
        """The notice with a spread: every session and request running now is given its own
        instant, evenly over the window (the first at once), rather than all of them together."""
        window = self._notice_spread
        if self._notice_room is not None:
            window = min(window, max(0.0, self._notice_room()) / 2)
        running = list(self._running)
        targets = len(self._sessions) + len(self._wrapped) + len(running)
        if targets == 0:
            return
        step = window / targets
        slot = 0
        for session in self._sessions:
            session.notice_delay = step * slot
            slot += 1
        for responder in self._wrapped:
            responder.notice_delay = step * slot
            slot += 1
        loop = asyncio.get_running_loop()
        listening = self._board.listening
        for cycle in running:
            delay = step * slot
            slot += 1
            if cycle in listening:
                listening[cycle] = delay  # its handler's wait() returns then, and it ends itself
            elif delay == 0:
                self._notice_one(cycle)
            else:
                loop.call_later(delay, self._notice_one, cycle)

    def _notice_one(self, cycle: Any) -> None:
        """The notice, at its own instant, for a server request still running (the cutoff
        acts on it itself if it came first)."""
        if (
            cycle not in self._running
            or self._gate.cutoff.is_set()
            or cycle in self._board.listening
        ):
            return
        try:
            if KNOWN_STREAMS.get(type(cycle)):
                _hypercorn.act("notice", cycle)
            else:
                act("notice", cycle)
        except Exception:  # a server that changed under us: log, never stop the drain
            logger.exception("drain.server_request_failed moment=notice")

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        gate = self._gate
        if not gate.try_admit("websocket"):
            gate.refused_websocket += 1
            await self._refuse_websocket(scope, receive, send)
            return
        session = _WebSocketSession(gate, send, self._close_code, scope)
        notice = self._board.notice(session)
        _offer(scope, notice)
        sessions = self._sessions
        sessions.add(session)
        watcher = asyncio.ensure_future(session.close_at_notice())
        try:
            await self.app(scope, receive, session.send)
        except Exception as error:
            if not (session.ended and _caused_by_drain(error)):
                raise
        except asyncio.CancelledError:
            if not session.forgive_cancel():
                raise  # cancelled by somebody else too (the server, say): that stands
            # A send blocked since before the drain, cancelled at the cutoff: given up.
        finally:
            notice._owner = None  # as under uvicorn: no cycle through the scope
            watcher.cancel()
            sessions.discard(session)
            if session.cancelled is not None:
                session.forgive_cancel()  # the app swallowed the cutoff's CancelledError
            if session.ended is not None:
                _end_connection(send, now=session.ended == ABANDONED_CODE)
            gate.release("websocket")

    async def _refuse_websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        if "websocket.http.response" in scope.get("extensions", {}):
            await send(
                {
                    "type": "websocket.http.response.start",
                    "status": 503,
                    "headers": self._refusal_headers,
                }
            )
            await send({"type": "websocket.http.response.body", "body": REFUSAL_BODY})
        else:
            await send({"type": "websocket.close", "code": _TRY_AGAIN_LATER, "reason": "draining"})


class _GivenUpAtCutoff(Listener):
    """The cutoff's hold on a request or session whose send has been blocked since before the
    drain (a client that does not read): cancel the task blocked in it, then take that back."""

    __slots__ = ("cancelled",)

    #: The task the cutoff cancelled to give up that send, until the cancel is taken back (each
    #: subclass sets it to None first: no ``__init__`` here, one call less per request).
    cancelled: asyncio.Task[Any] | None

    def _abandon(self) -> None:
        raise NotImplementedError

    def give_up(self, task: asyncio.Task[Any]) -> None:
        """At the cutoff: ``task`` is blocked in ``sending``, since before the drain; cancel it."""
        self._abandon()
        self.cancelled = task
        task.cancel("the client did not read before the drain's deadline")

    def forgive_cancel(self) -> bool:
        """Take back the cancel of :meth:`give_up` (see :func:`_take_back`)."""
        task, self.cancelled = self.cancelled, None
        return _take_back(task)


@final
class _WebSocketSession(_GivenUpAtCutoff):
    """Per-session state of one admitted WebSocket: who closed it, and the send lock."""

    __slots__ = (
        "_close_code",
        "_gate",
        "_lock",
        "_send",
        "app_closed",
        "ended",
        "responding",
        "scope",
        "sending",
        "since",
    )

    def __init__(self, gate: IntakeGate, send: Send, close_code: int, scope: Scope) -> None:
        self._gate = gate
        #: The session's scope and when it was admitted, for the status ``detail``.
        self.scope = scope
        self.since = _now()
        self._send = send
        self._close_code = close_code
        self._lock = asyncio.Lock()
        #: The app closed the session itself, or finished a denial response.
        self.app_closed = False
        #: The app began a denial response (``websocket.http.response.start``).
        self.responding = False
        #: Why the drain ended the session (a ``ConnectionClosedByDrainError`` code), or None.
        self.ended: str | None = None
        #: The server's send coroutine of the last message sent while not draining (done, or
        #: still blocked: what the cutoff looks for).
        self.sending: CoroutineType[Any, Any, None] | None = None
        self.cancelled = None
        self.notice_delay = 0.0  # its instant in the spread (Listener)
        self.listening = False

    async def send(self, message: Message) -> None:
        async with self._lock:
            kind = message["type"]
            if self.ended is not None:
                if kind == "websocket.close":
                    return  # closing what the drain already closed: nothing left to do
                raise ConnectionClosedByDrainError(
                    self.ended, detail="the drain ended this WebSocket; stop sending"
                )
            if kind == "websocket.http.response.start":
                self.responding = True
            elif kind == "websocket.close" or (
                kind == "websocket.http.response.body" and not message.get("more_body", False)
            ):
                self.app_closed = True
            if not self._gate.draining:
                # The server's own coroutine, kept for the cutoff: if a client that does not
                # read still blocks it then, the task blocked in it is cancelled (give_up).
                sending = self._send(message)
                if type(sending) is not CoroutineType:
                    sending = _awaiting(sending)
                self.sending = sending  # type: ignore[assignment]  # a coroutine now
                await sending
            elif not await _send_within(self._send, message, self._gate.cutoff):
                self._abandon()
                raise abandoned()

    async def close_at_notice(self) -> None:
        gate = self._gate
        await _notice_for(gate, self)
        # A send in progress holds the lock: the close waits for it until the cutoff at most,
        # when that send is given up (by itself, or by give_up) and the session with it.
        locking = await first(self._lock.acquire(), gate.cutoff.wait())
        if locking.cancelled():
            return
        try:
            if self.ended is not None or self.app_closed or self.responding:
                return  # a denial response in progress ends by itself
            self.ended = _CLOSED
            gate.closed_at_grace += 1
            close = {"type": "websocket.close", "code": self._close_code, "reason": "draining"}
            if not await _send_within(self._send, close, gate.cutoff):
                self._abandon()
        finally:
            self._lock.release()

    def abandon_connection(self) -> None:
        """At the cutoff, the session still running: give up on it and abort its connection."""
        self._abandon()
        _end_connection(self._send, now=True)

    def _abandon(self) -> None:
        if self.ended != ABANDONED_CODE:
            self.ended = ABANDONED_CODE
            logger.warning("drain.connection_abandoned kind=websocket")


def _end_connection(send: Send, *, now: bool) -> None:
    """End the connection of a WebSocket session the drain ended: at once (abandoned), or once
    its close handshake had :data:`CLOSE_HANDSHAKE_TIMEOUT` seconds (closed 1012): a client that
    never reads would otherwise keep the connection, and the server's stop, open for ever (the
    server closes it the usual way, which waits until its write buffer is flushed)."""
    transport = websocket_transport(send) or _hypercorn.websocket_transport(send)
    if transport is None:
        _cannot_end(send)
    elif now:
        transport.abort()
    else:
        asyncio.get_running_loop().call_later(CLOSE_HANDSHAKE_TIMEOUT, transport.abort)


#: The classes of ``send.__self__`` whose connection :func:`_end_connection` could not find.
_UNKNOWN_CONNECTIONS: Final[set[type]] = set()


def _cannot_end(send: Send) -> None:
    kind = type(getattr(send, "__self__", None))
    if kind in _UNKNOWN_CONNECTIONS:
        return
    _UNKNOWN_CONNECTIONS.add(kind)
    package = kind.__module__.partition(".")[0]
    try:
        version = importlib.metadata.version(package)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        version = "unknown"
    logger.warning(
        "drain.websocket_connection_unknown server=%s version=%s send=%s.%s: a WebSocket the "
        "drain ended is closed by the server its own way, which may wait on a client that does "
        "not read",
        package,
        version,
        kind.__module__,
        kind.__qualname__,
    )


_BODILESS_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})


@final
class _HttpResponder(_GivenUpAtCutoff):
    """Per-request state of one wrapped HTTP request (slotted: one per request)."""

    __slots__ = (
        "_gate",
        "_receive",
        "_send",
        "abandoned",
        "bodiless",
        "body_done",
        "closes",
        "disconnected",
        "finished",
        "scope",
        "sending",
        "since",
        "started",
    )

    def __init__(self, gate: IntakeGate, receive: Receive, send: Send, scope: Scope) -> None:
        self._gate = gate
        #: The request's scope and when it was admitted, for the status ``detail``.
        self.scope = scope
        self.since = _now()
        self._receive = receive
        self._send = send
        #: A method whose requests carry no body: the first receive() needs no inspection.
        self.bodiless = scope["method"] in _BODILESS_METHODS
        #: A response started while draining gains Connection: close (HTTP/1 only).
        self.closes = scope.get("http_version") not in _NO_CONNECTION_HEADER
        #: The app has read the whole request body.
        self.body_done = False
        #: The response has started / sent its last body part.
        self.started = self.finished = False
        #: The stream notice answered a receive() with http.disconnect.
        self.disconnected = False
        #: The drain gave up on this connection: a send was still blocked at the cutoff.
        self.abandoned = False
        #: The server's send coroutine of the last message sent while not draining (done, or
        #: still blocked: what the cutoff looks for).
        self.sending: CoroutineType[Any, Any, None] | None = None
        self.cancelled = None
        self.notice_delay = 0.0  # its instant in the spread (Listener)
        self.listening = False

    @property
    def cut_short(self) -> bool:
        """The notice ended the stream after the response started, before its last part."""
        return self.disconnected and self.started and not self.finished

    # receive and send are plain functions that hand back an awaitable: on the common path it is
    # the server's own, so the wrapper adds no coroutine frame per message. send keeps the last
    # one it handed back while not draining (``sending``), for the cutoff to look for.

    def receive(self) -> Awaitable[Message]:
        if self.body_done:
            return self._after_body()
        if self.bodiless:
            # GET, HEAD, OPTIONS: the first message is the whole (empty) body. A body sent
            # anyway is still read, but the stream notice may end it (documented).
            self.body_done = True
            return self._receive()
        return self._body()

    async def _body(self) -> Message:
        message = await self._receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.body_done = True
        return message

    async def _after_body(self) -> Message:
        # After the body only a disconnect can arrive: wait for it or for the stream notice.
        incoming = await _receive_or_notice(self._receive, self._gate, self)
        if incoming is None:
            self.disconnected = True
            return dict(_DISCONNECT)
        return incoming

    def send(self, message: Message) -> Awaitable[None]:
        draining = self._gate.draining
        if message["type"] == "http.response.start":
            self.started = True
            if draining and self.closes:
                message = _with_connection_close(message)
        elif not message.get("more_body", False):
            self.finished = True
        if draining:
            return self._send_before_cutoff(message)
        sending = self._send(message)
        if type(sending) is not CoroutineType:  # a server whose send is no coroutine function
            sending = _awaiting(sending)
        self.sending = sending  # type: ignore[assignment]  # a coroutine now
        return sending

    async def _send_before_cutoff(self, message: Message) -> None:
        if not self.abandoned:
            if await _send_within(self._send, message, self._gate.cutoff):
                return
            self._abandon()
        raise abandoned()

    def _abandon(self) -> None:
        """Give up on this connection (once): later sends raise, the count is released."""
        if not self.abandoned:
            self.abandoned = True
            logger.warning("drain.connection_abandoned kind=http")


def _take_back(task: asyncio.Task[Any] | None) -> bool:
    """Take back the cutoff's cancel of ``task``, in the request's (or session's) own task; True
    when the ``CancelledError`` it raised there came of that cancel alone (nobody else's pending)."""
    if task is None:
        return False
    current = asyncio.current_task()
    if current is None:
        return False
    if task is current:
        return current.uncancel() == 0
    # The app sent from a task of its own: the one cancelled; this one was not, unless
    # somebody else asked.
    return current.cancelling() == 0


async def _awaiting(sending: Awaitable[None]) -> None:
    await sending


async def _send_within(send: Send, message: Message, cutoff: asyncio.Event) -> bool:
    """Send ``message``; False (and the send cancelled) if it is still blocked at the cutoff.

    The send starts first, so one that does not block completes even after the cutoff.
    """
    sending = await first(send(message), cutoff.wait())
    if sending.cancelled():
        return False
    sending.result()  # the server's own error, if it raised one
    return True


def _uvicorn_gave_up(cycle: Any, error: Exception) -> bool:
    """While draining, the app of a uvicorn request raised ``error``: True when the drain gave
    up on its connection and the error came of that (then it is not passed on); otherwise the
    connection is put back, so that uvicorn can still answer the error."""
    if given_up(cycle) and _caused_by_drain(error):
        return True
    reconnect(cycle)
    return False


def _caused_by_drain(error: BaseException, depth: int = 0) -> bool:
    """True when ``error`` is, or was raised because of, the drain's ConnectionClosedByDrainError
    (an exception group: when each of its exceptions was)."""
    seen: BaseException | None = error
    while seen is not None and depth < 16:  # bounded: a cycle in __context__ cannot hang
        if isinstance(seen, ConnectionClosedByDrainError):
            return True
        if isinstance(seen, BaseExceptionGroup):
            return all(_caused_by_drain(inner, depth + 1) for inner in seen.exceptions)
        seen = seen.__cause__ or seen.__context__
        depth += 1
    return False


async def _receive_or_notice(
    receive: Receive, gate: IntakeGate, told: _HttpResponder
) -> Message | None:
    """The next message, or None once the stream notice is given (at ``told``'s instant)."""
    if gate.notice.is_set() and told.notice_delay == 0 and not told.listening:
        return None
    incoming = await first(receive(), _notice_for(gate, told))
    return None if incoming.cancelled() else incoming.result()


async def _notice_for(gate: IntakeGate, told: _HttpResponder | _WebSocketSession) -> None:
    """Return at ``told``'s instant of the stream notice: the notice plus its delay in the
    spread, or the cutoff if that comes first."""
    await gate.notice.wait()
    if told.notice_delay > 0 and not gate.cutoff.is_set():
        await first(asyncio.sleep(told.notice_delay), gate.cutoff.wait())
    if told.listening:  # its handler was told through the drain notice: it ends itself
        await gate.cutoff.wait()


def _offer(scope: Scope, notice: DrainNotice) -> None:
    """Put the drain notice in the scope's extensions (made when the server gave none)."""
    extensions = scope.get("extensions")
    if extensions is None:
        scope["extensions"] = {EXTENSION: notice}
    else:
        extensions[EXTENSION] = notice


def _caller_of_call() -> FrameType | None:
    """The frame that called :meth:`InFlightMiddleware.__call__`, seen from ``_route`` (which
    ``__call__`` calls): a server's wrapper awaiting this middleware, say."""
    frame = inspect.currentframe()  # this function's; then _route's, __call__'s, its caller's
    for _ in range(3):
        if frame is None:
            return None
        frame = frame.f_back
    return frame


def _with_connection_close(message: Message) -> Message:
    headers = list(message.get("headers", ()))
    for name, _ in headers:
        if name.lower() == b"connection":
            return message
    headers.append(CLOSE_HEADER)
    return {**message, "headers": headers}
