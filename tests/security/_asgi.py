"""Call an ASGI app with one hand-made HTTP request, as a server would, and record the answer.

Message level on purpose: the fuzz can then send what a server delivers but an HTTP client
library would tidy up (odd methods, raw header bytes, bodies split across messages).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from pydantic import BaseModel

from forgezero_lifecycle.asgi._types import ASGIApp, Message, Receive, Scope, Send
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.wire.handoff import StateImportContext

__all__ = [
    "CONTROL_TOKEN",
    "HANDOFF_TOKEN",
    "REVISION",
    "Answer",
    "Note",
    "NoteState",
    "call",
    "inner_app",
    "make_runtime",
]

CONTROL_TOKEN: Final = "security-control-token-0123456789abcdef"
#: 43 base64url characters: the only form a handoff request's authorization accepts.
HANDOFF_TOKEN: Final = "security-handoff-token-0123456789abcdefghij"
REVISION: Final = hashlib.sha1(b"security generation").hexdigest()


class Note(BaseModel):
    """The handoff state of the security tests."""

    text: str


class NoteState:
    """A state adapter that remembers whether it exported or imported."""

    protocol = "tests.security.note"
    schema_version = 1
    maximum_bytes = 4096
    model = Note

    def __init__(self, text: str = "a note") -> None:
        self.text = text
        self.exports = 0
        self.imported: Note | None = None

    async def export_state(self) -> tuple[str, Note]:
        self.exports += 1
        return "cursor-1", Note(text=self.text)

    async def import_state(self, value: Note, context: StateImportContext) -> None:
        self.imported = value


async def inner_app(scope: Scope, receive: Receive, send: Send) -> None:
    """The user's app behind the runtime: answers 200 to anything it is given."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"app"})


def make_runtime(state: NoteState | None = None) -> tuple[Runtime, ASGIApp]:
    """A runtime with both tokens, a revision and a state adapter, wrapping :func:`inner_app`."""
    runtime = Runtime(
        control_token=CONTROL_TOKEN,
        handoff_token=HANDOFF_TOKEN,
        revision=REVISION,
        state_adapter=state or NoteState(),
    )
    return runtime, runtime.wrap(inner_app)


@dataclass
class Answer:
    """What the app sent back for one request."""

    status: int = 0
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""
    starts: int = 0

    def json(self) -> Any:
        return orjson.loads(self.body)


async def call(
    app: ASGIApp,
    *,
    method: str,
    path: str,
    raw_path: bytes,
    query_string: bytes = b"",
    headers: Sequence[tuple[bytes, bytes]] = (),
    chunks: Sequence[bytes] = (b"",),
    hang_up: bool = False,
) -> Answer:
    """Run one request through ``app``; the body arrives as ``chunks`` (one message each).

    After the body, ``receive`` says the client disconnected (as a server does once the
    response is sent). With ``hang_up`` the client disconnects before its body ended.
    """
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": raw_path,
        "query_string": query_string,
        "root_path": "",
        "headers": list(headers),
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "extensions": {},
    }
    pending: list[Message] = [
        {"type": "http.request", "body": chunk, "more_body": hang_up or index < len(chunks) - 1}
        for index, chunk in enumerate(chunks)
    ]
    answer = Answer()

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            answer.starts += 1
            answer.status = message["status"]
            answer.headers = {bytes(k).lower(): bytes(v) for k, v in message.get("headers", ())}
        elif message["type"] == "http.response.body":
            answer.body += message.get("body", b"")

    await app(scope, receive, send)
    return answer
