"""The command line itself: the parser, the entry point, and errors as exit codes."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from pydantic import ValidationError

from .. import demo, serve
from .._errors import (
    BodyTooLargeError,
    ConfigurationError,
    ContentTypeInvalidError,
    ControlUnreachableError,
    DrainRequestInvalidError,
    LifecycleError,
    StateInputInvalidError,
    UnauthorizedError,
)
from .._version import __version__
from ..wire._types import first_problem, is_nonce
from . import k8s
from .commands import COMMANDS, DEFAULT_DEADLINE, RELOAD_WAIT, WAIT_MARGIN, UsageError
from .output import EXIT_FAILED, EXIT_GAVE_UP, EXIT_UNREACHABLE, EXIT_USAGE, fail

__all__ = ["build_parser", "main"]

_TOKEN_ENV: Final = (
    "  FORGEZERO_CONTROL_TOKEN   bearer token of the control plane (or --token-file)\n"
)
_USAGE_EXITS: Final = (
    "  2  usage: bad flags or values, missing token\n"
    "  3  control plane unreachable or unauthorized\n"
)


def _epilog(exits: str, environment: str = _TOKEN_ENV) -> str:
    """A subcommand's ``--help`` epilogue: its own exit codes, then the variables it reads."""
    text = "exit codes:\n" + exits
    return text + ("\nenvironment:\n" + environment if environment else "")


#: Each subcommand's exit codes and environment (``serve`` and ``demo`` write their own).
EPILOGS: Final = {
    "drain": _epilog(
        "  0  drained (with --no-wait: begun)\n"
        "  1  failed (the failure code is printed), or refused by the server\n"
        + _USAGE_EXITS
        + "  4  gave up waiting (--wait-timeout); the drain goes on\n"
    ),
    "status": _epilog(
        "  0  drained\n"
        "  1  failed or rolled back, or refused by the server\n"
        + _USAGE_EXITS
        + "  4  still draining\n"
    ),
    "rollback": _epilog(
        "  0  rolled back: the generation serves again\n  1  refused by the server\n" + _USAGE_EXITS
    ),
    "handoff": _epilog(
        "  0  acknowledged (with --no-wait: begun)\n"
        "  1  failed (the failure code is printed), or refused by the server\n"
        + _USAGE_EXITS
        + "  4  gave up waiting (--wait-timeout); the handoff goes on\n",
        _TOKEN_ENV + "  FORGEZERO_HANDOFF_TOKEN   the old generation's handoff token "
        "(or --handoff-token-file)\n",
    ),
    "reload": _epilog(
        "  0  done: the new generation serves (with --no-wait: begun)\n"
        "  1  aborted, or refused by the server\n"
        + _USAGE_EXITS
        + "  4  gave up waiting (--wait-timeout); the handover goes on\n"
    ),
    "check-k8s": _epilog(
        "  0  every budget holds (one line per container checked)\n"
        "  1  a budget does not hold: one line per problem, naming the field and the numbers\n"
        "  2  a file cannot be read or is not YAML (or PyYAML is missing: the [k8s] extra)\n",
        environment="",
    )
    + """
checked, for each container that runs `forgezero-lifecycle serve` or sets FORGEZERO_*:
  terminationGracePeriodSeconds >= preStop (sleep, or a drain hook's --timeout)
      + drain deadline (serve --drain-timeout, when no preStop drain) + the stop at the
      socket (first-byte grace + lingering close, 4s by default) + margin
      (the not-ready and stream graces run inside the drain deadline)
  readinessProbe periodSeconds x failureThreshold <= not-ready grace
  the not-ready grace <= half the drain deadline (a drain cuts it there)
""",
    "ready": _epilog(
        "  0  ready\n  1  not ready (draining)\n  2  usage: bad flags or values\n"
        "  3  unreachable\n  4  not ready within --wait (the reason is printed)\n",
        environment="",
    ),
}

TOP_EPILOG: Final = """\
Each command's --help lists its exit codes and the environment it reads. Tokens come from the
environment or a file, never from a flag.
"""


_URL_HELP: Final = "base URL of the generation (http://host:port)"


def _nonce(text: str) -> str:
    if not is_nonce(text):
        raise argparse.ArgumentTypeError(f"not a nonce (43 base64url characters): {text!r}")
    return text


def _exit_code(error: LifecycleError) -> int:
    if isinstance(error, ControlUnreachableError | UnauthorizedError):
        return EXIT_UNREACHABLE
    invalid = (
        DrainRequestInvalidError
        | StateInputInvalidError
        | BodyTooLargeError
        | ContentTypeInvalidError
    )
    if isinstance(error, invalid | ConfigurationError):
        return EXIT_USAGE
    return EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    """The console script; returns the exit code (see ``--help``)."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return serve.run(args.app, serve.options_from_args(args))
        if args.command == "demo":
            return demo.main(args)
        if args.command == "check-k8s":
            return k8s.run(args)  # PyYAML is imported by this command only
        return asyncio.run(COMMANDS[args.command](args))
    except UsageError as error:
        return fail(EXIT_USAGE, str(error))
    except ValidationError as error:  # never str(error): it would echo the input values
        return fail(EXIT_USAGE, f"invalid {first_problem(error)}")
    except LifecycleError as error:
        return fail(_exit_code(error), str(error))
    except TimeoutError:
        return fail(EXIT_GAVE_UP, "gave up waiting; the server goes on (check it with `status`)")
    except KeyboardInterrupt:
        return fail(130, "interrupted; a drain or handoff already begun goes on")
    except OSError as error:
        return fail(EXIT_USAGE, f"{error.strerror or error}: {error.filename or ''}".strip(": "))
    except Exception as error:  # a bug, still reported as one line
        return fail(EXIT_FAILED, f"unexpected {type(error).__name__}: {error}")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (``--help`` lists the exit codes)."""
    top = argparse.ArgumentParser(
        prog="forgezero-lifecycle",
        description="Hand an ASGI service over to its next generation with nothing lost.",
        epilog=TOP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        parser = commands.add_parser(
            name,
            help=help,
            description=help,
            epilog=EPILOGS.get(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if name not in ("serve", "demo", "check-k8s"):
            parser.add_argument("--retries", type=int, default=3, help=argparse.SUPPRESS)
            parser.add_argument(
                "--uds",
                metavar="PATH",
                help="reach the server through this unix socket (serve --uds); the URL "
                "still gives the Host, e.g. http://localhost",
            )
            parser.add_argument(
                "--cacert",
                type=Path,
                metavar="PATH",
                help="trust the CA certificates in PATH for an https URL (serve --ssl-certfile "
                "with a private CA or a self-signed certificate)",
            )
        if name not in ("ready", "demo", "check-k8s"):
            parser.add_argument(
                "--token-file",
                type=Path,
                metavar="PATH",
                help="read the control token from PATH, not the environment",
            )
        return parser

    drain = command("drain", "begin a drain and wait until it is drained or failed")
    drain.add_argument("--url", required=True, help="base URL of the generation to drain")
    drain.add_argument(
        "--source-revision",
        required=True,
        type=serve.parse_revision,
        metavar="REV",
        help="the draining generation's revision (40 hex); another is refused",
    )
    drain.add_argument(
        "--target-revision",
        required=True,
        type=serve.parse_revision,
        metavar="REV",
        help="the revision taking over (40 hex)",
    )
    status = command("status", "show a drain's status (the running drain's without --nonce)")
    status.add_argument("--url", required=True, help=_URL_HELP)
    status.add_argument(
        "--nonce", type=_nonce, help="the drain to show; default the running one (nonce shown)"
    )
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    rollback = command("rollback", "return a draining, drained or failed generation to serving")
    rollback.add_argument("--url", required=True, help=_URL_HELP)
    rollback.add_argument(
        "--nonce", required=True, type=_nonce, help="the drain to roll back (drain prints it)"
    )
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
    handoff.add_argument(
        "--schema-version",
        required=True,
        type=int,
        metavar="V",
        help="the state's schema version both generations' adapters agree on",
    )
    handoff.add_argument(
        "--source-revision",
        required=True,
        type=serve.parse_revision,
        metavar="REV",
        help="the old generation's revision (40 hex)",
    )
    handoff.add_argument(
        "--target-revision",
        required=True,
        type=serve.parse_revision,
        metavar="REV",
        help="the new generation's revision (40 hex)",
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
            type=serve.parse_deadline,
            default=DEFAULT_DEADLINE,
            help=f"the deadline the server enforces (default {DEFAULT_DEADLINE:g}s)",
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
    reload = command(
        "reload", "serve --workers: hand over to a new generation (as SIGHUP) and wait until done"
    )
    reload.add_argument("--url", required=True, help="base URL of serve --workers")
    reload.add_argument(
        "--no-wait", action="store_true", help="begin the handover and return at once"
    )
    reload.add_argument(
        "--wait-timeout",
        type=serve.parse_duration,
        metavar="DURATION",
        default=RELOAD_WAIT,
        help=f"give up waiting after this (default {RELOAD_WAIT:g}s); the handover goes on",
    )
    reload.add_argument("--json", action="store_true", help="print the final status as JSON")
    ready = command("ready", "probe readiness (exit 0 ready, 1 draining)")
    ready.add_argument("--url", required=True, help=_URL_HELP)
    ready.add_argument(
        "--wait",
        type=serve.parse_duration,
        metavar="DURATION",
        help="probe until ready, at most this long; then say why it gave up (exit 4)",
    )

    check = command(
        "check-k8s",
        "check that Kubernetes manifests give each drain the time it needs",
    )
    check.add_argument("files", nargs="+", type=Path, metavar="FILE", help="YAML manifests")
    check.add_argument(
        "--margin",
        type=serve.parse_duration,
        default=k8s.MARGIN,
        metavar="DURATION",
        help=f"kept for the hook's start and the exit (default {k8s.MARGIN:g}s)",
    )
    serve.add_arguments(command("serve", "run APP under uvicorn; SIGTERM drains it, then it exits"))
    demo.add_arguments(command("demo", "run two generations on loopback and hand over under load"))
    return top
