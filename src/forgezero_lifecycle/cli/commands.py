"""The commands that talk to a control plane: drain, status, rollback, handoff, reload, ready.

Each sends its requests through :class:`~forgezero_lifecycle.client.ControlClient`, shows its
progress on stderr while it waits, and returns the exit code its final status means
(:func:`~.output.report`).
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import urlencode, urlsplit, urlunsplit

import httpx

from .. import _tokens as tokens
from .._errors import ControlUnreachableError
from ..client import ControlClient, drain_request, handoff_request
from ..wire import paths
from .output import (
    EXIT_FAILED,
    EXIT_GAVE_UP,
    EXIT_OK,
    Progress,
    fail,
    handover_summary,
    printable,
    report,
)

__all__ = [
    "COMMANDS",
    "DEFAULT_DEADLINE",
    "RELOAD_WAIT",
    "WAIT_MARGIN",
    "UsageError",
    "export_url",
    "read_token",
]

S = TypeVar("S")

#: The deadline of ``drain`` and ``handoff`` without ``--timeout``.
DEFAULT_DEADLINE: Final = 30.0
#: Waiting goes on this long past the deadline the server enforces, unless --wait-timeout says.
WAIT_MARGIN: Final = 10.0
#: How often ``ready --wait`` probes.
READY_POLL: Final = 0.2
#: How long ``reload`` waits for its handover by default: the new workers' start, the old
#: generation's drain and stop are the supervisor's settings, which the client does not know.
RELOAD_WAIT: Final = 300.0


class UsageError(Exception):
    """A bad flag or value found before any request was sent (exit 2)."""


def _timeout_ms(seconds: float) -> int:
    """``--timeout`` (read by ``serve.parse_deadline``, so within the wire's bounds) in ms."""
    return round(seconds * 1000)


def read_token(env: str, path: Path | None, flag: str, *, handoff: bool = False) -> str:
    """The token from ``path`` when given, else from ``$env``; never from the command line.

    The rules (one line, bearer characters only, a private file) are :func:`tokens.read_token`.
    """
    token = tokens.read_token(env, path, flag=flag, handoff=handoff)
    if token is None:
        source = f"{flag} {path}" if path is not None else env
        raise UsageError(f"no token: {source} is empty or unset (set {env} or pass {flag})")
    return token


def _client(args: argparse.Namespace, url: str) -> ControlClient:
    token = read_token("FORGEZERO_CONTROL_TOKEN", args.token_file, "--token-file")
    return ControlClient(url, token=token, retries=args.retries, transport=_transport(args))


def _transport(args: argparse.Namespace) -> httpx.AsyncHTTPTransport | None:
    """``--uds`` and ``--cacert``: how to reach a ``serve`` on a unix socket or with TLS of a
    private CA (None: httpx's own, the system's CAs)."""
    if args.uds is None and args.cacert is None:
        return None
    verify: ssl.SSLContext | bool = True
    if args.cacert is not None:
        try:
            verify = ssl.create_default_context(cafile=str(args.cacert))
        except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
            raise UsageError(f"--cacert {args.cacert}: {error}") from None
    return httpx.AsyncHTTPTransport(uds=args.uds, verify=verify)


async def _watched(args: argparse.Namespace, wait: Callable[[Progress], Awaitable[S]]) -> S:
    """``wait`` with a progress line on stderr, given up after ``--wait-timeout``."""
    progress = Progress(sys.stderr, deadline=args.timeout)
    try:
        async with asyncio.timeout(args.wait_timeout or args.timeout + WAIT_MARGIN):
            return await wait(progress)
    finally:
        progress.close()


async def _drain(args: argparse.Namespace) -> int:
    request = drain_request(
        source_revision=args.source_revision,
        target_revision=args.target_revision,
        timeout_ms=_timeout_ms(args.timeout),
        nonce=args.nonce,
    )
    async with _client(args, args.url) as client:
        accepted = await client.begin_drain(request)
        verb = "following the drain already begun" if accepted.duplicate else "draining"
        print(f"{verb} {client.url} nonce={request.nonce}", file=sys.stderr)
        if args.no_wait:
            status = await client.drain_status(request.nonce)
            return report(args, status.model_dump(mode="json", exclude_none=True))
        status = await _watched(
            args, lambda progress: client.wait_drained(request.nonce, on_progress=progress.drain)
        )
    return report(args, status.model_dump(mode="json", exclude_none=True))


async def _status(args: argparse.Namespace) -> int:
    async with _client(args, args.url) as client:
        if args.nonce is None:
            status = await client.current_drain()
        else:
            status = await client.drain_status(args.nonce)
    return report(args, status.model_dump(mode="json", exclude_none=True))


async def _rollback(args: argparse.Namespace) -> int:
    async with _client(args, args.url) as client:
        status = await client.rollback(args.nonce)
    return report(args, status.model_dump(mode="json", exclude_none=True))


async def _handoff(args: argparse.Namespace) -> int:
    handoff_token = read_token(
        "FORGEZERO_HANDOFF_TOKEN", args.handoff_token_file, "--handoff-token-file", handoff=True
    )
    request = handoff_request(
        protocol=args.protocol,
        schema_version=args.schema_version,
        source_revision=args.source_revision,
        target_revision=args.target_revision,
        source_url=export_url(args.from_export_url, args.source_revision, args.target_revision),
        handoff_token=handoff_token,
        nonce=args.nonce,
    )
    async with _client(args, args.to) as client:
        await client.begin_handoff(request, timeout_ms=_timeout_ms(args.timeout))
        print(f"handing state to {client.url} nonce={request.nonce}", file=sys.stderr)
        if args.no_wait:
            status = await client.handoff_status(request.nonce)
        else:
            status = await _watched(
                args,
                lambda progress: client.wait_handoff(request.nonce, on_progress=progress.handoff),
            )
    return report(args, status.model_dump(mode="json", exclude_none=True))


def export_url(given: str, source_revision: str, target_revision: str) -> str:
    """``given`` as the full export URL: a bare base URL gets the export path and the query,
    which says that the importer checks the value (``importCheck=importer``: the new generation
    validates it, so the old one does not as well); a URL with a query of its own is kept."""
    url = urlsplit(given)
    path = url.path if url.path not in ("", "/") else paths.RUNTIME_STATE_EXPORT_PATH
    query = url.query or urlencode(
        {
            "sourceRevision": source_revision,
            "targetRevision": target_revision,
            paths.IMPORT_CHECK_QUERY: paths.IMPORTER_CHECKS,
        }
    )
    return urlunsplit((url.scheme, url.netloc, path, query, url.fragment))


async def _reload(args: argparse.Namespace) -> int:
    async with _client(args, args.url) as client:
        accepted = await client.reload()
        print(f"handover {accepted.handover} begun at {client.url}", file=sys.stderr)
        if args.no_wait:
            status = await client.handover_status(accepted.handover)
        else:
            progress = Progress(sys.stderr, deadline=args.wait_timeout)
            try:
                async with asyncio.timeout(args.wait_timeout):
                    status = await client.wait_handover(
                        accepted.handover, on_progress=progress.handover
                    )
            finally:
                progress.close()
    if args.json:
        sys.stdout.write(status.model_dump_json(by_alias=True) + "\n")
    else:
        print(printable(handover_summary(status)))
    return EXIT_FAILED if status.state == "aborted" else EXIT_OK


async def _ready(args: argparse.Namespace) -> int:
    if args.wait is not None:
        return await _wait_ready(args.url, args.wait, _transport(args))
    async with ControlClient(args.url, retries=args.retries, transport=_transport(args)) as client:
        ready = await client.ready()
    print("ready" if ready else "not ready (draining)")
    return EXIT_OK if ready else EXIT_FAILED


async def _wait_ready(
    url: str, seconds: float, transport: httpx.AsyncHTTPTransport | None = None
) -> int:
    """``ready --wait``: probe until ready; past ``seconds``, say why it gave up (exit 4).

    A start-up script's wait that cannot spin forever: a server that exited (a bad revision, an
    app that does not import) leaves a refused connection, which is the reason printed.
    """
    deadline = time.monotonic() + seconds
    async with ControlClient(url, retries=0, transport=transport) as client:
        while True:
            try:
                if await client.ready():
                    print("ready")
                    return EXIT_OK
                reason = "not ready (draining)"
            except ControlUnreachableError as error:
                reason = str(error)
            if time.monotonic() >= deadline:
                return fail(EXIT_GAVE_UP, f"not ready after {seconds:g}s: {reason}")
            await asyncio.sleep(READY_POLL)


COMMANDS: Final[dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]]] = {
    "drain": _drain,
    "status": _status,
    "rollback": _rollback,
    "handoff": _handoff,
    "ready": _ready,
    "reload": _reload,
}
