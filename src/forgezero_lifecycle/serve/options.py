"""The ``serve`` command's options: flags, durations, revisions and tokens, and uvicorn's
production flags under uvicorn's names and with uvicorn's meanings.

:class:`ServeOptions` holds every value ``serve`` takes (:func:`options_from_args`), uvicorn's
among them (:class:`UvicornOptions`). ``serve`` runs uvicorn in every process that serves (the
one process, or each worker of ``--workers N``), so most flags become arguments of that
process's ``uvicorn.Config`` (:func:`config_arguments`). The rest are carried out by ``serve``
itself, because it does the work uvicorn would do in their place:

* ``--uds`` and ``--fd``: the process that holds the listener binds the unix socket or takes the
  descriptor (:mod:`.listeners`); with ``--workers`` that is the supervisor, and every worker
  accepts on it;
* ``--env-file``: loaded before the tokens are read and the app is imported, as uvicorn loads it
  before its app (existing variables win, as with uvicorn);
* ``--factory``: the factory is called before ``serve`` looks for the app's runtime;
* ``--log-config``: the logging of every process (the supervisor's too);
* ``--loop``: the event loop every serving process runs.

Every value is checked when ``serve`` starts, before anything is bound (:func:`check`): a missing
certificate, a key that does not match it, a wrong key password, ``--uds`` with ``--host``: a
:class:`~forgezero_lifecycle.errors.ConfigurationError` (``RUNTIME_CONFIG_INVALID``) that names
the flag, and nothing changed. docs/serve.md ("uvicorn's flags") maps every uvicorn option to
``serve``; tests/serve/test_uvicorn_options.py keeps that table equal to the installed
uvicorn's options.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import importlib.util
import inspect
import logging.config
import os
import re
import shlex
import ssl
import subprocess
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, final

from .._errors import ConfigurationError
from .._internals import uvicorn as _uvicorn
from .._tokens import read_token
from ..wire import _protocol
from ..wire._types import is_revision

__all__ = [
    "LOOPS",
    "NOT_TAKEN",
    "ServeOptions",
    "UvicornOptions",
    "add_arguments",
    "add_uvicorn_arguments",
    "check",
    "check_address",
    "config_arguments",
    "configure_logging",
    "load_env_file",
    "loop_factory",
    "options_from_args",
    "options_from_wire",
    "parse_deadline",
    "parse_duration",
    "parse_revision",
    "read_revision",
    "uvicorn_options_from_args",
]


#: uvicorn's options ``serve`` does not take, and why (``serve --help`` lists them; the table
#: in docs/serve.md says the same, tests/serve/test_uvicorn_options.py keeps them equal).
NOT_TAKEN: Final = (
    (
        ("--reload", "--reload-dir", "--reload-include", "--reload-exclude", "--reload-delay"),
        "serve --workers hands over to a new generation (the code imported anew) on SIGHUP "
        "or `forgezero-lifecycle reload`",
    ),
    (
        ("--http2",),
        "needs uvicorn's zttp protocol; the zero-loss stop wraps h11 and httptools",
    ),
    (("--interface",), "serve serves ASGI 3 apps: wrap an ASGI 2 or WSGI app first"),
    (
        ("--limit-max-requests", "--limit-max-requests-jitter"),
        "uvicorn stops the worker, losing what it holds; serve recycles one with nothing lost "
        "(--max-requests, --max-requests-jitter)",
    ),
    (
        ("--timeout-graceful-shutdown",),
        "--drain-timeout is the one deadline; uvicorn's is set above it",
    ),
    (
        ("--timeout-worker-healthcheck",),
        "the supervisor's watchdog (--worker-timeout) replaces a worker that stops answering",
    ),
    (("--version",), "forgezero-lifecycle --version"),
)

#: ``--loop``'s names (anything else is ``module:attribute`` of a loop factory, as in uvicorn).
LOOPS: Final = ("none", "auto", "asyncio", "uvloop")
LIFESPANS: Final = ("auto", "on", "off")
#: ``--ssl-cert-reqs``: ``ssl.CERT_NONE``, ``CERT_OPTIONAL``, ``CERT_REQUIRED``.
CERT_REQS: Final = (ssl.CERT_NONE, ssl.CERT_OPTIONAL, ssl.CERT_REQUIRED)


@final
@dataclass(frozen=True, slots=True)
class UvicornOptions:
    """uvicorn's flags as ``serve`` takes them; each default is uvicorn's own, except ``loop``.

    ``loop`` is ``asyncio`` unless given: the loop ``serve``'s zero-loss stop is tested on
    (uvicorn's default, ``auto``, picks uvloop where it is installed). Every field is plain
    data, so the options travel to a supervisor's workers over their channel.
    """

    uds: str | None = None
    fd: int | None = None
    loop: str = "asyncio"
    lifespan: Literal["auto", "on", "off"] = "auto"
    env_file: str | None = None
    log_config: str | None = None
    use_colors: bool | None = None
    proxy_headers: bool = True
    forwarded_allow_ips: str | None = None
    server_header: bool = True
    date_header: bool = True
    headers: tuple[tuple[str, str], ...] = ()
    limit_concurrency: int | None = None
    backlog: int = 2048
    timeout_keep_alive: int = 5
    ws_max_size: int = 16 * 1024 * 1024
    ws_max_queue: int = 32
    ws_ping_interval: float | None = 20.0
    ws_ping_timeout: float | None = 20.0
    ws_per_message_deflate: bool = True
    h11_max_incomplete_event_size: int | None = None
    reset_contextvars: bool = False
    factory: bool = False
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    #: Never logged; travels to the workers over their private channel only.
    ssl_keyfile_password: str | None = dataclasses.field(default=None, repr=False)
    ssl_version: int = int(ssl.PROTOCOL_TLS_SERVER)
    ssl_cert_reqs: int = int(ssl.CERT_NONE)
    ssl_ca_certs: str | None = None
    ssl_ciphers: str | None = None

    def __post_init__(self) -> None:
        # From a worker's channel (JSON), the headers come as lists.
        object.__setattr__(self, "headers", tuple((str(k), str(v)) for k, v in self.headers))
        problem = _value_problem(self)
        if problem is not None:
            raise ConfigurationError(detail=problem)

    @classmethod
    def from_wire(cls, fields: Mapping[str, Any]) -> UvicornOptions:
        """The options from their ``dataclasses.asdict`` form (unknown names ignored)."""
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{name: value for name, value in fields.items() if name in names})

    @property
    def is_ssl(self) -> bool:
        """Whether connections are TLS (uvicorn's ``Config.is_ssl``)."""
        return bool(self.ssl_keyfile or self.ssl_certfile)


def _value_problem(options: UvicornOptions) -> str | None:
    """What is wrong with a value on its own (files and sockets are :func:`check`'s)."""
    positive = (
        ("--limit-concurrency", options.limit_concurrency),
        ("--backlog", options.backlog),
        ("--ws-max-size", options.ws_max_size),
        ("--ws-max-queue", options.ws_max_queue),
        ("--h11-max-incomplete-event-size", options.h11_max_incomplete_event_size),
    )
    for flag, value in positive:
        if value is not None and value < 1:
            return f"{flag} takes a positive number, not {value}"
    for flag, seconds in (
        ("--timeout-keep-alive", options.timeout_keep_alive),
        ("--ws-ping-interval", options.ws_ping_interval),
        ("--ws-ping-timeout", options.ws_ping_timeout),
    ):
        if seconds is not None and seconds < 0:
            return f"{flag} takes seconds (0 or more), not {seconds}"
    if options.uds is not None and options.fd is not None:
        return "give --uds or --fd, not both"
    if options.fd is not None and options.fd < 0:
        return f"--fd takes a file descriptor, not {options.fd}"
    if options.uds == "":
        return "--uds takes a path"
    if options.lifespan not in LIFESPANS:
        return f"--lifespan takes {', '.join(LIFESPANS)}, not {options.lifespan!r}"
    if options.loop not in LOOPS and ":" not in options.loop:
        return f"--loop takes {', '.join(LOOPS)} or module:attribute, not {options.loop!r}"
    if options.ssl_cert_reqs not in CERT_REQS:
        return f"--ssl-cert-reqs takes 0 (none), 1 (optional) or 2 (required), not {options.ssl_cert_reqs}"
    if options.ssl_keyfile and not options.ssl_certfile:
        return "--ssl-keyfile needs --ssl-certfile"
    for header, text in options.headers:
        if not header.strip() or not (header + text).isascii() or "\n" in header + text:
            return f"--header takes Name:Value in ASCII, not {header!r}:{text!r}"
    return None


def add_uvicorn_arguments(parser: argparse.ArgumentParser) -> None:
    """uvicorn's flags, in one argument group; each default is :class:`UvicornOptions`'."""
    default = UvicornOptions()
    not_taken = "\n".join(
        textwrap.fill(
            f"{', '.join(flags)}: {reason}", width=92, initial_indent="  ", subsequent_indent="    "
        )
        for flags, reason in NOT_TAKEN
    )
    group = parser.add_argument_group(
        "uvicorn options",
        "uvicorn's own flags, with uvicorn's meanings, applied in every process that serves\n"
        "(docs/serve.md maps every uvicorn option). Not taken:\n" + not_taken,
    )
    add = group.add_argument
    add("--uds", metavar="PATH", help="bind to this unix socket (not with --host or --port)")
    add(
        "--fd",
        type=int,
        metavar="FD",
        help="serve on the listening socket of this inherited file descriptor",
    )
    add(
        "--loop",
        default=default.loop,
        metavar="LOOP",
        help="the event loop: none, auto (uvloop when installed), asyncio, uvloop or "
        f"module:attribute of a loop factory (default: {default.loop})",
    )
    add(
        "--lifespan",
        default=default.lifespan,
        choices=LIFESPANS,
        help=f"the ASGI lifespan (default: {default.lifespan})",
    )
    add("--env-file", metavar="PATH", help="load environment variables from this file first")
    add(
        "--log-config",
        metavar="PATH",
        help="logging configuration file (.json, .yaml or .ini) of every process",
    )
    add(
        "--use-colors",
        action=argparse.BooleanOptionalAction,
        default=default.use_colors,
        help="colours in the default log format (default: when a terminal)",
    )
    add(
        "--access-log",
        dest="no_access_log",
        action="store_false",
        help="a line per request (the default; --no-access-log turns it off)",
    )
    add(
        "--proxy-headers",
        action=argparse.BooleanOptionalAction,
        default=default.proxy_headers,
        help="take the client address and scheme from X-Forwarded-For and X-Forwarded-Proto "
        "of trusted proxies (default: on)",
    )
    add(
        "--forwarded-allow-ips",
        metavar="IPS",
        help="comma-separated addresses or networks trusted with proxy headers, '*' for all "
        "(default: $FORWARDED_ALLOW_IPS or 127.0.0.1,::1)",
    )
    add(
        "--server-header",
        action=argparse.BooleanOptionalAction,
        default=default.server_header,
        help="the default Server header (default: on)",
    )
    add(
        "--date-header",
        action=argparse.BooleanOptionalAction,
        default=default.date_header,
        help="the default Date header (default: on)",
    )
    add(
        "--header",
        dest="headers",
        action="append",
        default=[],
        type=_header,
        metavar="NAME:VALUE",
        help="a default response header (repeatable)",
    )
    add(
        "--limit-concurrency",
        type=int,
        metavar="N",
        help="per process: answer 503 beyond this many connections and tasks",
    )
    add(
        "--backlog",
        type=int,
        default=default.backlog,
        metavar="N",
        help=f"the listening socket's accept queue (default: {default.backlog})",
    )
    add(
        "--timeout-keep-alive",
        type=int,
        default=default.timeout_keep_alive,
        metavar="SECONDS",
        help="close an idle keep-alive connection after this long (default: "
        f"{default.timeout_keep_alive})",
    )
    add(
        "--ws-max-size",
        type=int,
        default=default.ws_max_size,
        metavar="BYTES",
        help=f"largest WebSocket message (default: {default.ws_max_size})",
    )
    add(
        "--ws-max-queue",
        type=int,
        default=default.ws_max_queue,
        metavar="N",
        help=f"WebSocket messages queued (default: {default.ws_max_queue})",
    )
    add(
        "--ws-ping-interval",
        type=float,
        default=default.ws_ping_interval,
        metavar="SECONDS",
        help=f"WebSocket ping interval (default: {default.ws_ping_interval:g})",
    )
    add(
        "--ws-ping-timeout",
        type=float,
        default=default.ws_ping_timeout,
        metavar="SECONDS",
        help=f"WebSocket ping timeout (default: {default.ws_ping_timeout:g})",
    )
    add(
        "--ws-per-message-deflate",
        type=_boolean,
        default=default.ws_per_message_deflate,
        metavar="BOOL",
        help="WebSocket per-message-deflate compression (default: true)",
    )
    add(
        "--h11-max-incomplete-event-size",
        type=int,
        metavar="BYTES",
        help="h11: the most bytes buffered of an incomplete event",
    )
    add(
        "--reset-contextvars",
        action="store_true",
        help="run each request in a fresh contextvars.Context",
    )
    add("--factory", action="store_true", help="APP is a factory: call it for the ASGI app")
    add("--ssl-keyfile", metavar="PATH", help="TLS private key file")
    add("--ssl-certfile", metavar="PATH", help="TLS certificate (chain) file")
    add("--ssl-keyfile-password", metavar="PASSWORD", help="the private key's password")
    add(
        "--ssl-version",
        type=int,
        default=default.ssl_version,
        metavar="N",
        help=f"TLS protocol, as the ssl module numbers it (default: {default.ssl_version})",
    )
    add(
        "--ssl-cert-reqs",
        type=int,
        default=default.ssl_cert_reqs,
        metavar="N",
        help="client certificates: 0 none, 1 optional, 2 required (default: 0)",
    )
    add("--ssl-ca-certs", metavar="PATH", help="CA certificates that sign client certificates")
    add("--ssl-ciphers", metavar="CIPHERS", help="OpenSSL cipher list (default: OpenSSL's)")


def _header(text: str) -> tuple[str, str]:
    name, colon, value = text.partition(":")
    if not colon:
        raise argparse.ArgumentTypeError(f"--header takes NAME:VALUE, not {text!r}")
    return name, value


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "t", "yes", "y", "on"):
        return True
    if lowered in ("0", "false", "f", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r} (true or false)")


def uvicorn_options_from_args(args: argparse.Namespace) -> UvicornOptions:
    """The parsed flags as :class:`UvicornOptions`; ``--env-file`` is loaded now, before
    anything reads the environment."""
    options = UvicornOptions(
        **{
            field.name: getattr(args, field.name)
            for field in dataclasses.fields(UvicornOptions)
            if hasattr(args, field.name)
        }
    )
    if options.env_file is not None:
        load_env_file(options.env_file)
    return options


def load_env_file(path: str) -> None:
    """uvicorn's ``--env-file``: python-dotenv's ``load_dotenv`` (variables already set win)."""
    if not Path(path).is_file():
        raise ConfigurationError(detail=f"--env-file {path}: no such file")
    if importlib.util.find_spec("dotenv") is None:
        raise ConfigurationError(
            detail="--env-file needs python-dotenv (pip install python-dotenv, or uvicorn[standard])"
        )
    from dotenv import load_dotenv

    load_dotenv(dotenv_path=path)


def check_address(options: UvicornOptions, *, host_or_port_given: bool) -> None:
    """``--uds`` and ``--fd`` replace ``--host`` and ``--port``: giving both is refused."""
    if host_or_port_given and (options.uds is not None or options.fd is not None):
        flag = "--uds" if options.uds is not None else "--fd"
        raise ConfigurationError(detail=f"{flag} replaces --host and --port: give one or the other")


def check(options: UvicornOptions) -> None:
    """Refuse what cannot start, before anything is bound or started: files, the TLS context
    (certificate, key, password, ciphers), the loop, the log config's format, a flag this
    uvicorn lacks. Raises :class:`ConfigurationError` naming the flag."""
    for flag, path in (
        ("--ssl-certfile", options.ssl_certfile),
        ("--ssl-keyfile", options.ssl_keyfile),
        ("--ssl-ca-certs", options.ssl_ca_certs),
        ("--log-config", options.log_config),
        ("--env-file", options.env_file),
    ):
        if path is not None and not Path(path).is_file():
            raise ConfigurationError(detail=f"{flag} {path}: no such file")
    if options.is_ssl:
        ssl_context(options)
    loop_factory(options.loop)
    yaml = options.log_config is not None and options.log_config.endswith((".yaml", ".yml"))
    if yaml and importlib.util.find_spec("yaml") is None:
        raise ConfigurationError(
            detail="--log-config with YAML needs PyYAML (pip install pyyaml, or uvicorn[standard])"
        )
    supported = inspect.signature(_uvicorn.config_class()).parameters
    for name in config_arguments(options):
        if name not in supported:
            flag = "--" + name.replace("_", "-")
            raise ConfigurationError(
                detail=f"uvicorn {_uvicorn.version()} has no {flag}; upgrade uvicorn"
            )


def ssl_context(options: UvicornOptions) -> ssl.SSLContext:
    """The TLS context uvicorn builds in each serving process, built here once to check it."""
    assert options.ssl_certfile is not None
    try:
        return _uvicorn.create_ssl_context(
            keyfile=options.ssl_keyfile,
            certfile=options.ssl_certfile,
            password=options.ssl_keyfile_password,
            ssl_version=options.ssl_version,
            cert_reqs=options.ssl_cert_reqs,
            ca_certs=options.ssl_ca_certs,
            ciphers=options.ssl_ciphers,
        )
    except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
        reason = getattr(error, "reason", None) or getattr(error, "strerror", None) or error
        raise ConfigurationError(
            detail=f"TLS (--ssl-certfile {options.ssl_certfile}, --ssl-keyfile "
            f"{options.ssl_keyfile}): {reason}"
        ) from None


def loop_factory(loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """``--loop``'s event loop factory (None: asyncio's default), as uvicorn resolves it."""
    if loop in ("none", "asyncio"):
        return None if loop == "none" else asyncio.new_event_loop
    if loop in ("auto", "uvloop"):
        if importlib.util.find_spec("uvloop") is not None:
            import uvloop

            factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
            return factory
        if loop == "uvloop":
            raise ConfigurationError(detail="--loop uvloop: uvloop is not installed")
        return asyncio.new_event_loop
    try:
        imported = _uvicorn.import_from_string(loop)
    except _uvicorn.import_error() as error:
        raise ConfigurationError(detail=f"--loop {loop}: {error}") from None
    if not callable(imported):
        raise ConfigurationError(detail=f"--loop {loop} is not a loop factory")
    return imported  # type: ignore[no-any-return]


def config_arguments(options: UvicornOptions) -> dict[str, Any]:
    """The ``uvicorn.Config`` arguments of the flags that differ from uvicorn's defaults.

    ``uds``, ``fd``, ``loop``, ``env_file``, ``factory`` and ``log_config`` are ``serve``'s to
    carry out (the module docstring), so they are not among them; TLS and the rest are.
    """
    default = UvicornOptions()
    handled_by_serve = {"uds", "fd", "loop", "env_file", "factory", "log_config"}
    arguments: dict[str, Any] = {}
    for field in dataclasses.fields(UvicornOptions):
        name = field.name
        value = getattr(options, name)
        if name in handled_by_serve or value == getattr(default, name):
            continue
        arguments[name] = list(value) if name == "headers" else value
    return arguments


def configure_logging(options: UvicornOptions, fallback: dict[str, Any]) -> dict[str, Any] | str:
    """Apply the logging of this process: ``--log-config``'s file, else ``fallback`` (serve's
    own dictConfig); returns what uvicorn's ``Config(log_config=...)`` is to be given."""
    path = options.log_config
    if path is None:
        logging.config.dictConfig(fallback)
        return fallback
    try:
        if path.endswith(".json"):
            import json

            logging.config.dictConfig(json.loads(Path(path).read_text()))
        elif path.endswith((".yaml", ".yml")):
            yaml = importlib.import_module("yaml")  # PyYAML (uvicorn[standard]); check() saw it
            logging.config.dictConfig(yaml.safe_load(Path(path).read_text()))
        else:
            logging.config.fileConfig(path, disable_existing_loggers=False)
    except Exception as error:  # a broken file: logging raises ValueError, KeyError, ...
        raise ConfigurationError(
            detail=f"--log-config {path}: {type(error).__name__}: {error}"
        ) from None
    return os.fspath(path)


# The serve command's own options.


_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)?")
_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


@final
@dataclass(frozen=True, slots=True)
class ServeOptions:
    """How to serve.

    ``revision``, ``not_ready_grace`` and ``stream_grace`` are None when not given. ``serve``
    builds a runtime from them when the app has none (0 s and 5 s by default); an app that
    builds its own runtime must agree with every one that was given (see :func:`~.server.run`).
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
    #: uvicorn's own flags (:class:`UvicornOptions`).
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
    #: Import the app once per generation and fork its workers from that process
    #: (:mod:`.preload`).
    preload: bool = False

    def __post_init__(self) -> None:
        problem = deadline_problem(self.drain_timeout)
        if problem is not None:
            raise ConfigurationError(detail=f"drain_timeout={self.drain_timeout:g} s is {problem}")
        if self.workers is None and self.recycling_flags():
            flags = ", ".join(self.recycling_flags())
            raise ConfigurationError(
                detail=f"{flags} need --workers N: a supervisor replaces the worker"
            )
        if self.preload:
            if self.workers is None:
                raise ConfigurationError(
                    detail="--preload needs --workers N: workers are forked from the import"
                )
            from .forking import available

            why = available()
            if why is not None:
                raise ConfigurationError(detail=why)

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
    add(
        "--preload",
        action="store_true",
        help="import the app once per generation and fork its workers from that process, so "
        "a recycled, replacement or added worker starts in milliseconds (gunicorn's --preload; "
        "each SIGHUP's generation imports the code anew; Linux)",
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
        "preload": args.preload,
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
    # The bound is the machine's, imported where the flag is parsed (once, in the process that
    # becomes the supervisor) rather than with this module: a worker process reads its options
    # from the wire, and importing the machine's hundred dataclasses would cost each worker's
    # start about 35 ms of CPU.
    from .machine import MAX_WORKERS

    if not text.isdigit() or not 1 <= int(text) <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"--workers takes 1 to {MAX_WORKERS}, not {text!r}")
    return int(text)
