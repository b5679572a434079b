"""What the zero-loss stop relies on of uvicorn is checked at start-up, naming the version."""

from __future__ import annotations

import pytest
import uvicorn

from forgezero_lifecycle._errors import ConfigurationError
from forgezero_lifecycle._internals import uvicorn as _uvicorn
from forgezero_lifecycle.stop.server import HANDOVER_GRACE, LINGER_TIMEOUT, ServerStop


async def _app(scope: object, receive: object, send: object) -> None:
    """Never called: the servers below are never started."""


def test_uvicorn_has_internals() -> None:
    """The installed uvicorn has every internal the stop uses, so every real-server test checks the
    stop."""
    assert _uvicorn.missing(uvicorn.Server(uvicorn.Config(_app, log_config=None))) == []


def test_missing_internal_refused() -> None:
    """A server without an internal is refused: ``serve`` refuses to start (RUNTIME_CONFIG_INVALID)
    and says which uvicorn and what."""

    class _Bare:
        force_exit = False
        should_exit = False

    with pytest.raises(ConfigurationError) as raised:
        # A stand-in lacking the internals, on purpose: the check must name what is missing.
        _uvicorn.check(_Bare())  # type: ignore[arg-type]
    assert raised.value.code == "RUNTIME_CONFIG_INVALID"
    assert f"uvicorn {uvicorn.__version__}" in str(raised.value.detail)
    assert "Server.server_state" in str(raised.value.detail)


def test_hook_skips_non_uvicorn() -> None:
    """Only a uvicorn ``Server`` gets the stop attached (hypercorn's handler owner does not)."""
    assert ServerStop.attach(object()) is None


def test_attach_wraps_once() -> None:
    """Attaching wraps the protocol class with the stop once and replaces the instance's
    shutdown."""
    server = uvicorn.Server(uvicorn.Config(_app, log_config=None, http="h11"))
    server.config.load()
    base = server.config.http_protocol_class
    held = ServerStop.attach(server)
    assert held is not None
    # The attribute is set on the wrapped protocol class at run time; no stub declares it.
    assert server.config.http_protocol_class.zero_loss_stop is held.stop  # type: ignore[attr-defined]
    assert issubclass(server.config.http_protocol_class, base)
    assert "shutdown" in vars(server)
    again = ServerStop.attach(server)  # a second lifespan in the same process
    assert again is not None
    assert again.stop is held.stop


def test_gunicorn_graceful_timeout() -> None:
    """gunicorn's --graceful-timeout must exceed every part of a worker's stop: the handover, the
    drain and the linger."""
    # Imported here: `make test-oldest` runs this module without gunicorn (-k 'not gunicorn').
    from forgezero_lifecycle.gunicorn import required_graceful_timeout

    assert required_graceful_timeout(30.0) > HANDOVER_GRACE + 30.0 + LINGER_TIMEOUT
    assert required_graceful_timeout(30.0) == 39  # 38.5 s, in whole seconds


def test_protocol_mismatch_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker builds its connections' protocol as ``Server.startup`` does: a uvicorn whose
    protocol takes other arguments is reported (the real class, its constructor replaced)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    def other(self: object, config: object, server_state: object) -> None: ...

    monkeypatch.setattr(H11Protocol, "__init__", other)
    lacking = _uvicorn.missing(uvicorn.Server(uvicorn.Config(_app, log_config=None)))
    # Its __init__ sets neither transport nor cycle either: both are named too.
    assert lacking == [
        "H11Protocol(app_state=)",
        "H11Protocol(_loop=)",
        "H11Protocol.transport",
        "H11Protocol.cycle",
    ]
