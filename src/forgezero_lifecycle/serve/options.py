"""The ``serve`` command's options: flags, durations, revisions and tokens."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, final

from .._errors import ConfigurationError
from .._tokens import read_token
from ..wire import _protocol
from ..wire._types import is_revision
from .machine import MAX_WORKERS
from .uvicorn_options import (
    UvicornOptions,
    add_uvicorn_arguments,
    check_address,
    uvicorn_options_from_args,
)

__all__ = [
    "ServeOptions",
    "add_arguments",
    "options_from_args",
    "options_from_wire",
    "parse_deadline",
    "parse_duration",
    "parse_revision",
    "read_revision",
]

_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)?")
_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


@final
@dataclass(frozen=True, slots=True)
class ServeOptions:
    """How to serve.

    ``revision``, ``not_ready_grace`` and ``stream_grace`` are None when not given. ``serve``
    builds a runtime from them when the app has none (0 s and 5 s by default); an app that
    builds its own runtime must agree with every one that was given (see :func:`~.command.run`).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    drain_timeout: float = 30.0
    revision: str | None = None
    not_ready_grace: float | None = None
    stream_grace: float | None = None
    first_byte_grace: float = 1.0
    control_token: str | None = None
    handoff_token: str | None = None
    insecure_loopback_control: bool = False
    http: str = "auto"
    ws: str = "auto"
    root_path: str = ""
    log_level: str = "info"
    access_log: bool = True
    app_dir: str = "."
    #: None: one process, as plain ``serve``; N: a supervisor running generations of N workers.
    workers: int | None = None
    revision_file: str | None = None
    revision_command: str | None = None
    start_timeout: float = 30.0
    handover_grace: float = 1.0
    #: Ends every log line of this process (a supervisor's worker: ``worker=0 generation=1``).
    log_label: str = ""
    #: uvicorn's own flags (:mod:`.uvicorn_options`).
    uvicorn: UvicornOptions = dataclasses.field(default_factory=UvicornOptions)
    # Worker recycling and health (``serve --workers``; None: off).
    #: Recycle a worker after this many requests (plus 0 to ``max_requests_jitter`` more).
    max_requests: int | None = None
    max_requests_jitter: int = 0
    #: Recycle a worker whose resident memory passes this many MiB.
    max_worker_memory: int | None = None
    #: Recycle a worker this many seconds after it began to accept.
    max_worker_lifetime: float | None = None
    #: Replace, then kill, a worker whose event loop does not answer the heartbeat this long.
    worker_timeout: float | None = None

    def __post_init__(self) -> None:
        problem = deadline_problem(self.drain_timeout)
        if problem is not None:
            raise ConfigurationError(detail=f"drain_timeout={self.drain_timeout:g} s is {problem}")
        if self.workers is None and self.recycling_flags():
            flags = ", ".join(self.recycling_flags())
            raise ConfigurationError(
                detail=f"{flags} need --workers N: a supervisor replaces the worker"
            )

    def recycling_flags(self) -> list[str]:
        """The recycling and watchdog flags given (each needs a supervisor)."""
        given = {
            "--max-requests": self.max_requests,
            "--max-requests-jitter": self.max_requests_jitter or None,
            "--max-worker-memory": self.max_worker_memory,
            "--max-worker-lifetime": self.max_worker_lifetime,
            "--worker-timeout": self.worker_timeout,
        }
        return [flag for flag, value in given.items() if value is not None]


def parse_duration(text: str) -> float:
    """``30s``, ``500ms``, ``2m``, ``1h`` or plain seconds, as seconds (an argparse ``type``)."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 30s, 500ms or 2m)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_deadline(text: str) -> float:
    """A drain's (or a handoff's) deadline: a duration from 100ms to 10m (an argparse ``type``).

    The wire protocol's ``timeoutMs`` bounds, checked when the flag is read rather than when a
    drain begins (which would clamp it, or refuse it only once a signal came).
    """
    seconds = parse_duration(text)
    problem = deadline_problem(seconds)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text!r} is {problem}")
    return seconds


def deadline_problem(seconds: float) -> str | None:
    """Why ``seconds`` cannot be a deadline (too short, too long), or None."""
    return _protocol.deadline_problem(round(seconds * 1000))


def parse_revision(text: str) -> str:
    """A 40-hex revision (an argparse ``type``)."""
    if not is_revision(text):
        raise argparse.ArgumentTypeError(f"not a revision (40 lowercase hex digits): {text!r}")
    return text


EXIT_CODES_HELP: Final = """\
exit codes:
  0  the self-drain after SIGTERM/SIGINT reached drained
  1  it failed or was rolled back, a second signal forced the stop, or the server did not start
  2  usage: bad flags or values, the app cannot be imported

environment:
  FORGEZERO_CONTROL_TOKEN, FORGEZERO_HANDOFF_TOKEN   tokens of a runtime serve builds itself
  FORGEZERO_REVISION          the revision when --revision is absent (e.g. the Kubernetes
                              downward API); set from --revision otherwise, for the app to read
  FORGEZERO_NOT_READY_GRACE   set from --not-ready-grace, for the app to read
  FORGEZERO_STREAM_GRACE      set from --stream-grace, for the app to read
  LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES   systemd socket activation: serve on these sockets

signals (with --workers; FORGEZERO_REVISION and the graces are then set per generation):
  SIGTERM, SIGINT  drain every worker as one generation, then exit; a second one forces the stop
  SIGHUP           start a new generation on the same socket, then drain and stop the old one
  SIGTTIN, SIGTTOU add one worker / remove one (it hands its clients over and drains; never < 1)
"""


#: Every flag's default is the :class:`ServeOptions` field's (written there only).
_DEFAULTS: Final[dict[str, Any]] = {
    field.name: field.default for field in dataclasses.fields(ServeOptions)
}


def _seconds(seconds: float) -> str:
    """``30s``, ``500ms``, ``1.5s``: a duration as the flags write it."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``serve`` command's flags (tokens come from the environment or files); each default
    is the one of :class:`ServeOptions`."""
    parser.epilog = EXIT_CODES_HELP
    add = parser.add_argument
    default = _DEFAULTS
    add("app", metavar="APP", help="module:attribute of the ASGI app")
    add("--host", default=default["host"], action=_Address, help=f"default: {default['host']}")
    add(
        "--port",
        type=int,
        default=default["port"],
        action=_Address,
        help=f"default: {default['port']}",
    )
    add(
        "--revision",
        type=parse_revision,
        metavar="REV",
        help="the revision this generation runs (default: $FORGEZERO_REVISION); a drain for "
        "another sourceRevision is refused",
    )
    add(
        "--drain-timeout",
        type=parse_deadline,
        default=default["drain_timeout"],
        metavar="DURATION",
        help=f"the self-drain's deadline, 100ms to 10m (default "
        f"{_seconds(default['drain_timeout'])}); uvicorn's graceful timeout is above it",
    )
    add(
        "--not-ready-grace",
        type=parse_duration,
        metavar="DURATION",
        help="keep admitting this long after readiness turns 503 (default 0s); exported as "
        "FORGEZERO_NOT_READY_GRACE",
    )
    add(
        "--stream-grace",
        type=parse_duration,
        metavar="DURATION",
        help="then WebSockets get 1012 and streams end (default 5s); exported as "
        "FORGEZERO_STREAM_GRACE",
    )
    add(
        "--first-byte-grace",
        type=parse_duration,
        default=default["first_byte_grace"],
        metavar="DURATION",
        help="at the stop, connections with no request yet wait this long for one (default "
        f"{_seconds(default['first_byte_grace'])})",
    )
    add(
        "--handoff-token-file",
        type=Path,
        metavar="PATH",
        help="read the handoff token of a runtime serve builds itself from PATH, not the "
        "environment",
    )
    add(
        "--insecure-loopback-control",
        action="store_true",
        help="no control token: admit loopback control clients only (development)",
    )
    add(
        "--http",
        default=default["http"],
        choices=("auto", "h11", "httptools"),
        help=f"uvicorn's HTTP implementation (default: {default['http']})",
    )
    add(
        "--ws",
        default=default["ws"],
        metavar="IMPL",
        help="uvicorn's WebSocket implementation: auto, websockets, wsproto or none (default: "
        f"{default['ws']})",
    )
    add(
        "--root-path",
        default=default["root_path"],
        metavar="PATH",
        help="the ASGI root_path, when a proxy serves the app under a path prefix",
    )
    add(
        "--log-level",
        default=default["log_level"],
        metavar="LEVEL",
        help=f"uvicorn's log level: critical, error, warning, info, debug or trace (default: "
        f"{default['log_level']})",
    )
    add("--no-access-log", action="store_true", help="no line per request")
    add(
        "--app-dir",
        default=default["app_dir"],
        help=f"added to sys.path (default: {default['app_dir']})",
    )
    add(
        "--workers",
        type=_workers,
        metavar="N",
        help="run a supervisor: one held socket, generations of N worker processes, SIGHUP "
        "hands over to a new generation on the same port (default: one process, no supervisor)",
    )
    add(
        "--revision-file",
        type=Path,
        metavar="PATH",
        help="with --workers: each generation's revision, read from PATH when it starts",
    )
    add(
        "--revision-command",
        metavar="COMMAND",
        help="with --workers: each generation's revision, printed by COMMAND (e.g. "
        "'git rev-parse HEAD') when it starts",
    )
    add(
        "--start-timeout",
        type=parse_duration,
        default=default["start_timeout"],
        metavar="DURATION",
        help="with --workers: a worker not ready within this fails its generation (default "
        f"{_seconds(default['start_timeout'])})",
    )
    add(
        "--handover-grace",
        type=parse_duration,
        default=default["handover_grace"],
        metavar="DURATION",
        help="with --workers: on a handover the old workers stop accepting and close idle "
        "keep-alive connections this long before their intake closes (default "
        f"{_seconds(default['handover_grace'])})",
    )
    add_uvicorn_arguments(parser)
    _add_recycling_arguments(parser)


class _Address(argparse.Action):
    """``--host`` and ``--port``: stored, and remembered as given (``--uds`` and ``--fd``
    replace them, so giving both is refused)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        namespace.address_given = True


def _add_recycling_arguments(parser: argparse.ArgumentParser) -> None:
    """Worker recycling and health (with ``--workers``): a worker past a limit, or whose event
    loop stops answering, is replaced as a handover replaces a generation (the new worker
    accepts first)."""
    group = parser.add_argument_group(
        "worker recycling and health",
        "with --workers: a worker past a limit is replaced one at a time; its replacement "
        "accepts before it stops accepting, hands its keep-alive clients over and drains",
    )
    add = group.add_argument
    add(
        "--max-requests",
        type=_count("--max-requests"),
        metavar="N",
        help="recycle a worker after N requests (default: never; gunicorn's --max-requests, "
        "uvicorn's --limit-max-requests)",
    )
    add(
        "--max-requests-jitter",
        type=_count("--max-requests-jitter", least=0),
        default=0,
        metavar="N",
        help="each worker's limit is --max-requests plus 0 to N more, so workers do not all "
        "recycle at once (default 0)",
    )
    add(
        "--max-worker-memory",
        type=_count("--max-worker-memory"),
        metavar="MIB",
        help="recycle a worker whose resident memory (RSS) passes MIB mebibytes (default: never)",
    )
    add(
        "--max-worker-lifetime",
        type=_positive_duration("--max-worker-lifetime"),
        metavar="DURATION",
        help="recycle a worker this long after it began to accept, e.g. 1h (default: never)",
    )
    add(
        "--worker-timeout",
        type=_positive_duration("--worker-timeout"),
        metavar="DURATION",
        help="a worker whose event loop does not answer the supervisor's heartbeat this long is "
        "replaced (its replacement ready first), then killed (default: off; gunicorn's "
        "--timeout is 30s)",
    )


def _count(flag: str, *, least: int = 1) -> Any:
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < least:
            raise argparse.ArgumentTypeError(
                f"{flag} takes a whole number >= {least}, not {text!r}"
            )
        return int(text)

    return parse


def _positive_duration(flag: str) -> Any:
    def parse(text: str) -> float:
        seconds = parse_duration(text)
        if seconds < _SHORTEST_LIMIT:
            raise argparse.ArgumentTypeError(f"{flag} takes 100ms or more, not {text!r}")
        return seconds

    return parse


#: The shortest lifetime or heartbeat timeout a flag takes.
_SHORTEST_LIMIT: Final = 0.1


def options_from_args(args: argparse.Namespace) -> ServeOptions:
    """Map parsed flags, ``FORGEZERO_CONTROL_TOKEN`` and ``FORGEZERO_HANDOFF_TOKEN`` to options
    (``--env-file`` is loaded first, so the tokens may come from it)."""
    uvicorn = uvicorn_options_from_args(args)
    check_address(uvicorn, host_or_port_given=getattr(args, "address_given", False))
    return ServeOptions(
        host=args.host,
        port=args.port,
        drain_timeout=args.drain_timeout,
        revision=args.revision or _revision_from_env(),
        not_ready_grace=args.not_ready_grace,
        stream_grace=args.stream_grace,
        first_byte_grace=args.first_byte_grace,
        control_token=read_token("FORGEZERO_CONTROL_TOKEN", args.token_file, flag="--token-file"),
        handoff_token=read_token(
            "FORGEZERO_HANDOFF_TOKEN",
            args.handoff_token_file,
            flag="--handoff-token-file",
            handoff=True,
        ),
        insecure_loopback_control=args.insecure_loopback_control,
        http=args.http,
        ws=args.ws,
        root_path=args.root_path,
        log_level=args.log_level,
        access_log=not args.no_access_log,
        app_dir=args.app_dir,
        workers=args.workers,
        revision_file=None if args.revision_file is None else str(args.revision_file),
        revision_command=args.revision_command,
        start_timeout=args.start_timeout,
        handover_grace=args.handover_grace,
        uvicorn=uvicorn,
        **_recycling_options(args),
    )


def options_from_wire(fields: dict[str, Any]) -> ServeOptions:
    """The options from their ``dataclasses.asdict`` form, as a worker reads them from its
    channel (unknown names ignored)."""
    names = {field.name for field in dataclasses.fields(ServeOptions)}
    given = {name: value for name, value in fields.items() if name in names}
    if isinstance(given.get("uvicorn"), dict):
        given["uvicorn"] = UvicornOptions.from_wire(given["uvicorn"])
    return ServeOptions(**given)


def _recycling_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "max_requests": args.max_requests,
        "max_requests_jitter": args.max_requests_jitter,
        "max_worker_memory": args.max_worker_memory,
        "max_worker_lifetime": args.max_worker_lifetime,
        "worker_timeout": args.worker_timeout,
    }


def _revision_from_env() -> str | None:
    """``FORGEZERO_REVISION`` when set (one source of the revision: the pod's downward API)."""
    text = os.environ.get("FORGEZERO_REVISION", "").strip()
    if not text:
        return None
    if not is_revision(text):
        raise ConfigurationError(
            detail=f"FORGEZERO_REVISION is not a revision (40 lowercase hex digits): {text[:48]!r}"
        )
    return text


def read_revision(options: ServeOptions) -> str | None:
    """This generation's revision: ``--revision-file``, ``--revision-command`` or ``--revision``."""
    if options.revision_file is not None:
        source = f"--revision-file {options.revision_file}"
        try:
            text = Path(options.revision_file).read_text().strip()
        except OSError as error:
            raise ConfigurationError(detail=f"{source}: {error.strerror or error}") from None
    elif options.revision_command is not None:
        source = f"--revision-command {options.revision_command!r}"
        try:
            done = subprocess.run(
                shlex.split(options.revision_command),
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
        except (OSError, subprocess.SubprocessError) as error:
            raise ConfigurationError(detail=f"{source} failed: {error}") from None
        text = done.stdout.strip()
    else:
        return options.revision
    if not is_revision(text):
        raise ConfigurationError(detail=f"{source} gave {text[:60]!r}, not 40 lowercase hex digits")
    return text


def _workers(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"--workers takes 1 to {MAX_WORKERS}, not {text!r}")
    return int(text)
