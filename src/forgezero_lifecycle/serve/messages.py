"""The messages on a worker's private channel (:mod:`.channel`), as types both ends import.

Worker → supervisor::

    {"event": "state", "state": ..., ...}              StateReport (a one-way notice)
    {"event": "limit", "why": str}                     LimitReport: past a recycling limit
    {"id": 7, "op": "control", "call": str, "args": {}}  ControlCall, answered with
                                                        {"status": int, "headers": [[n, v]], "body": ...}

Supervisor → worker: one request per entry of :data:`COMMANDS` (``{"id": 7, "op": <name>,
...fields}``), each answered by the worker's handler of that name (a dispatch table in
:mod:`.worker`). A message that does not decode is answered ``RUNTIME_BAD_MESSAGE`` and changes
nothing; it never ends the channel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, final

__all__ = [
    "COMMANDS",
    "COUNTER_KINDS",
    "ControlCall",
    "LimitReport",
    "StateReport",
    "WorkerReport",
    "decode_worker_message",
]

COUNTER_KINDS: Final = ("http", "websocket", "jobs", "schedules")

#: The supervisor's commands to a worker: name → the fields it carries.
COMMANDS: Final = {
    "begin": ("request",),
    "rollback": ("nonce",),
    "status": (),
    "schedules": (),
    "metrics": (),
    "import": ("request", "timeoutMs"),
    "accept": (),
    "stop_accepting": (),
    "stop": ("force",),
    # Leave a generation that serves on (recycled, scaled down): stop accepting, let the
    # keep-alive clients move to the siblings for ``grace`` seconds, then drain and stop.
    "retire": ("grace",),
    # The heartbeat (``--worker-timeout``): answered by the worker's event loop.
    "ping": (),
}


@final
@dataclass(frozen=True, slots=True)
class StateReport:
    """What a worker reports of itself: booting, ready, failed to start, and its drain."""

    state: str
    pid: int | None = None
    nonce: str | None = None
    in_flight: dict[str, int] | None = None
    failure: str | None = None
    detail: str | None = None
    private_port: int = 0
    state_kind: dict[str, Any] | None = None
    revision: str | None = None

    def wire(self) -> dict[str, Any]:
        fields = {
            "pid": self.pid,
            "nonce": self.nonce,
            "inFlight": self.in_flight,
            "failure": self.failure,
            "detail": self.detail,
            "privatePort": self.private_port or None,
            "stateKind": self.state_kind,
            "revision": self.revision,
        }
        present = {key: value for key, value in fields.items() if value is not None}
        return {"event": "state", "state": self.state, **present}


@final
@dataclass(frozen=True, slots=True)
class ControlCall:
    """A control request the worker forwards, for the whole generation."""

    call: str
    args: dict[str, Any]

    def wire(self) -> dict[str, Any]:
        return {"op": "control", "call": self.call, "args": self.args}


@final
@dataclass(frozen=True, slots=True)
class LimitReport:
    """The worker passed one of its recycling limits (sent again while it still accepts)."""

    why: str

    def wire(self) -> dict[str, Any]:
        return {"event": "limit", "why": self.why}


WorkerReport = StateReport | ControlCall | LimitReport


def _optional(message: dict[str, Any], key: str, kind: type) -> Any:
    value = message.get(key)
    if value is not None and not isinstance(value, kind):
        raise ValueError(f"{key} must be {kind.__name__}")
    return value


def decode_worker_message(message: dict[str, Any]) -> WorkerReport | str:
    """The typed message, or why it is not one (a string)."""
    try:
        if message.get("event") == "state":
            state = message.get("state")
            if not isinstance(state, str):
                return "a state report without a state"
            in_flight = _optional(message, "inFlight", dict)
            port = _optional(message, "privatePort", int)
            return StateReport(
                state=state,
                pid=_optional(message, "pid", int),
                nonce=_optional(message, "nonce", str),
                in_flight=None if in_flight is None else {k: int(v) for k, v in in_flight.items()},
                failure=_optional(message, "failure", str),
                detail=_optional(message, "detail", str),
                private_port=port or 0,
                state_kind=_optional(message, "stateKind", dict),
                revision=_optional(message, "revision", str),
            )
        if message.get("event") == "limit":
            why = message.get("why")
            if not isinstance(why, str):
                return "a limit report without why (a string)"
            return LimitReport(why)
        if message.get("op") == "control":
            call, args = message.get("call"), message.get("args")
            if not isinstance(call, str) or not isinstance(args, dict):
                return "a control call needs call (a string) and args (an object)"
            return ControlCall(call, args)
    except (ValueError, TypeError, AttributeError) as error:
        return str(error)
    return f"unknown message {sorted(message)}"
