"""``forgezero-lifecycle``: drive a generation's drain and handoff, serve an app, run the demo.

Tokens come from ``FORGEZERO_CONTROL_TOKEN`` and ``FORGEZERO_HANDOFF_TOKEN`` (or a file named by
``--token-file`` / ``--handoff-token-file``), never from a flag that ``ps`` would show. Errors
are one line on stderr; progress goes to stderr, results (and ``--json``) to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Final, TextIO
from urllib.parse import urlencode, urlsplit, urlunsplit

import orjson
from pydantic import ValidationError

from . import _tokens as tokens
from . import demo, serve
from ._errors import (
    BodyTooLarge,
    ConfigurationError,
    ContentTypeInvalid,
    ControlUnreachable,
    DrainRequestInvalid,
    LifecycleError,
    StateInputInvalid,
    Unauthorized,
)
from .client import ControlClient, drain_request, handoff_request
from .wire import paths
from .wire._types import first_problem, is_nonce
from .wire.drain import MAX_DRAIN_TIMEOUT_MS, MIN_DRAIN_TIMEOUT_MS, DrainStatus
from .wire.handoff import StateHandoffStatus

__all__ = ["EXIT_FAILED", "EXIT_GAVE_UP", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE", "main"]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3
EXIT_GAVE_UP: Final = 4

#: Waiting goes on this long past the deadline the server enforces, unless --wait-timeout says.
WAIT_MARGIN: Final = 10.0

EXIT_CODES_HELP: Final = """\
exit codes:
  0  drained / acknowledged / rolled back / ready
  1  failed (the failure code is printed), not ready, or refused by the server
  2  usage: bad flags or values, missing token
  3  control plane unreachable or unauthorized
  4  not settled: gave up waiting (the drain or handoff goes on), or `status` says draining

environment:
  FORGEZERO_CONTROL_TOKEN   bearer token of the control plane (drain, status, rollback, handoff)
  FORGEZERO_HANDOFF_TOKEN   the old generation's handoff token (handoff, serve)
"""


class UsageError(Exception):
    """A bad flag or value found before any request was sent (exit 2)."""


def _nonce(text: str) -> str:
    if not is_nonce(text):
        raise argparse.ArgumentTypeError(f"not a nonce (43 base64url characters): {text!r}")
    return text


def _timeout_ms(seconds: float) -> int:
    timeout_ms = round(seconds * 1000)
    if not MIN_DRAIN_TIMEOUT_MS <= timeout_ms <= MAX_DRAIN_TIMEOUT_MS:
        raise UsageError(
            f"--timeout must be between {MIN_DRAIN_TIMEOUT_MS}ms and "
            f"{MAX_DRAIN_TIMEOUT_MS // 60_000}m, got {seconds:g}s"
        )
    return timeout_ms


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
    return ControlClient(url, token=token, retries=args.retries)


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
            return _report(args, status.model_dump(mode="json", exclude_none=True))
        progress = Progress(sys.stderr, deadline=args.timeout)
        try:
            async with asyncio.timeout(args.wait_timeout or args.timeout + WAIT_MARGIN):
                status = await client.wait_drained(request.nonce, on_progress=progress.drain)
        finally:
            progress.close()
    return _report(args, status.model_dump(mode="json", exclude_none=True))


async def _status(args: argparse.Namespace) -> int:
    async with _client(args, args.url) as client:
        if args.nonce is None:
            status = await client.current_drain()
        else:
            status = await client.drain_status(args.nonce)
    return _report(args, status.model_dump(mode="json", exclude_none=True))


async def _rollback(args: argparse.Namespace) -> int:
    async with _client(args, args.url) as client:
        status = await client.rollback(args.nonce)
    return _report(args, status.model_dump(mode="json", exclude_none=True))


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
            progress = Progress(sys.stderr, deadline=args.timeout)
            try:
                async with asyncio.timeout(args.wait_timeout or args.timeout + WAIT_MARGIN):
                    status = await client.wait_handoff(request.nonce, on_progress=progress.handoff)
            finally:
                progress.close()
    return _report(args, status.model_dump(mode="json", exclude_none=True))


def export_url(given: str, source_revision: str, target_revision: str) -> str:
    """``given`` as the full export URL: a bare base URL gets the export path and the query."""
    url = urlsplit(given)
    path = url.path if url.path not in ("", "/") else paths.RUNTIME_STATE_EXPORT_PATH
    query = url.query or urlencode(
        {"sourceRevision": source_revision, "targetRevision": target_revision}
    )
    return urlunsplit((url.scheme, url.netloc, path, query, url.fragment))


async def _reload(args: argparse.Namespace) -> int:
    async with _client(args, args.url) as client:
        await client.reload()
    print(f"handover to a new generation begun at {args.url}")
    return EXIT_OK


async def _ready(args: argparse.Namespace) -> int:
    async with ControlClient(args.url, retries=args.retries) as client:
        ready = await client.ready()
    print("ready" if ready else "not ready (draining)")
    return EXIT_OK if ready else EXIT_FAILED


class Progress:
    """While waiting: one live line on a TTY, one line per change elsewhere."""

    def __init__(self, stream: TextIO, *, deadline: float) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._deadline = deadline
        self._started = time.monotonic()
        self._last = ""
        self._live = False

    def drain(self, status: DrainStatus) -> None:
        self._show(f"{status.status}  {_counters(status.in_flight.model_dump())}")

    def handoff(self, status: StateHandoffStatus) -> None:
        self._show(status.status)

    def _show(self, line: str) -> None:
        clock = f"{time.monotonic() - self._started:.1f}s / {self._deadline:g}s"
        if self._tty:
            self._stream.write(f"\r\x1b[2K{line}  {clock}")
            self._live = True
        elif line != self._last:
            self._stream.write(f"{line}  {clock}\n")
        self._last = line
        self._stream.flush()

    def close(self) -> None:
        if self._live:
            self._stream.write("\n")
            self._stream.flush()
            self._live = False


def summary(status: dict[str, object]) -> str:
    """The final status as one line: state, failure code, counters, digest, nonce."""
    parts = [str(status["status"])]
    if "failure" in status:
        parts.append(f"failure={status['failure']}")
    if isinstance(in_flight := status.get("inFlight"), dict):
        parts.append(_counters(in_flight))
    parts.extend(f"{key}={status[key]}" for key in ("cursor", "digest", "nonce") if key in status)
    return "  ".join(parts)


def _counters(counters: dict[str, object]) -> str:
    return " ".join(f"{kind}={count}" for kind, count in counters.items())


_OK_STATES: Final = frozenset({"drained", "acknowledged"})


def _report(args: argparse.Namespace, status: dict[str, object]) -> int:
    """Print the final status; the exit code follows from it."""
    state = str(status["status"])
    if getattr(args, "json", False):
        sys.stdout.write(orjson.dumps(status).decode() + "\n")
    else:
        print(printable(summary(status)))
    if state in _OK_STATES or (args.command == "rollback" and state == "rolled-back"):
        return EXIT_OK
    if state in ("draining", "pending"):
        return EXIT_OK if args.command != "status" and args.no_wait else EXIT_GAVE_UP
    return EXIT_FAILED


def _exit_code(error: LifecycleError) -> int:
    if isinstance(error, ControlUnreachable | Unauthorized):
        return EXIT_UNREACHABLE
    invalid = DrainRequestInvalid | StateInputInvalid | BodyTooLarge | ContentTypeInvalid
    if isinstance(error, invalid | ConfigurationError):
        return EXIT_USAGE
    return EXIT_FAILED


_COMMANDS: Final = {
    "drain": _drain,
    "status": _status,
    "rollback": _rollback,
    "handoff": _handoff,
    "ready": _ready,
    "reload": _reload,
}


def main(argv: Sequence[str] | None = None) -> int:
    """The console script; returns the exit code (see ``--help``)."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return serve.run(args.app, serve.options_from_args(args))
        if args.command == "demo":
            return demo.main(args)
        return asyncio.run(_COMMANDS[args.command](args))
    except UsageError as error:
        return _fail(EXIT_USAGE, str(error))
    except ValidationError as error:  # never str(error): it would echo the input values
        return _fail(EXIT_USAGE, f"invalid {first_problem(error)}")
    except LifecycleError as error:
        return _fail(_exit_code(error), str(error))
    except TimeoutError:
        return _fail(EXIT_GAVE_UP, "gave up waiting; the server goes on (check it with `status`)")
    except KeyboardInterrupt:
        return _fail(130, "interrupted; a drain or handoff already begun goes on")
    except OSError as error:
        return _fail(EXIT_USAGE, f"{error.strerror or error}: {error.filename or ''}".strip(": "))
    except Exception as error:  # a bug, still reported as one line
        return _fail(EXIT_FAILED, f"unexpected {type(error).__name__}: {error}")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (``--help`` lists the exit codes)."""
    top = argparse.ArgumentParser(
        prog="forgezero-lifecycle",
        description="Hand an ASGI service over to its next generation with nothing lost.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        parser = commands.add_parser(
            name,
            help=help,
            description=help,
            epilog=EXIT_CODES_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if name not in ("serve", "demo"):
            parser.add_argument("--retries", type=int, default=3, help=argparse.SUPPRESS)
        if name not in ("ready", "demo"):
            parser.add_argument(
                "--token-file",
                type=Path,
                metavar="PATH",
                help="read the control token from PATH, not the environment",
            )
        return parser

    drain = command("drain", "begin a drain and wait until it is drained or failed")
    drain.add_argument("--url", required=True, help="base URL of the generation to drain")
    drain.add_argument("--source-revision", required=True, type=serve.parse_revision, metavar="REV")
    drain.add_argument("--target-revision", required=True, type=serve.parse_revision, metavar="REV")
    status = command("status", "show a drain's status (the running drain's without --nonce)")
    status.add_argument("--url", required=True)
    status.add_argument(
        "--nonce", type=_nonce, help="the drain to show; default the running one (nonce shown)"
    )
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    rollback = command("rollback", "return a draining, drained or failed generation to serving")
    rollback.add_argument("--url", required=True)
    rollback.add_argument("--nonce", required=True, type=_nonce)
    rollback.add_argument("--json", action="store_true", help="print the status as JSON")
    handoff = command("handoff", "make the new generation fetch and import the old one's state")
    handoff.add_argument("--to", required=True, metavar="URL", help="base URL of the new one")
    handoff.add_argument(
        "--from-export-url",
        required=True,
        metavar="URL",
        help="the old generation's base URL or full export URL (loopback)",
    )
    handoff.add_argument("--protocol", required=True, help="the state adapter's protocol")
    handoff.add_argument("--schema-version", required=True, type=int, metavar="V")
    handoff.add_argument(
        "--source-revision", required=True, type=serve.parse_revision, metavar="REV"
    )
    handoff.add_argument(
        "--target-revision", required=True, type=serve.parse_revision, metavar="REV"
    )
    handoff.add_argument(
        "--handoff-token-file",
        type=Path,
        metavar="PATH",
        help="read the old generation's handoff token from PATH",
    )
    for waiting in (drain, handoff):
        waiting.add_argument(
            "--timeout",
            type=serve.parse_duration,
            default=30.0,
            help="the deadline the server enforces (default 30s)",
        )
        waiting.add_argument("--nonce", type=_nonce, help="reuse a nonce (retry); default fresh")
        waiting.add_argument("--no-wait", action="store_true", help="begin and return at once")
        waiting.add_argument(
            "--wait-timeout",
            type=serve.parse_duration,
            metavar="DURATION",
            help=f"give up waiting after this (default deadline + {WAIT_MARGIN:g}s)",
        )
        waiting.add_argument("--json", action="store_true", help="print the final status as JSON")
    reload = command("reload", "serve --workers: hand over to a new generation (as SIGHUP)")
    reload.add_argument("--url", required=True)
    ready = command("ready", "probe readiness (exit 0 ready, 1 draining)")
    ready.add_argument("--url", required=True)

    serve.add_arguments(command("serve", "run APP under uvicorn; SIGTERM drains it, then it exits"))
    demo.add_arguments(command("demo", "run two generations on loopback and hand over under load"))
    return top


def _fail(code: int, message: str) -> int:
    line = " ".join(printable(message).split())  # one line, whatever a server put in its detail
    print(f"forgezero-lifecycle: error: {line}", file=sys.stderr)
    return code


def printable(text: str) -> str:
    """``text`` safe for a terminal: whitespace becomes a space, other control and format
    characters (escape sequences, bidirectional overrides) are dropped.

    Server-supplied text (an error ``detail``, a ``failure``) passes through here before it is
    printed, so a server cannot write to the operator's terminal.
    """
    return "".join(
        " " if c.isspace() else c
        for c in text
        if c.isspace() or not unicodedata.category(c).startswith("C")
    )


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
