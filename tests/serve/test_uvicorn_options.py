"""uvicorn's flags on ``serve``: each becomes what uvicorn makes of it, in every worker, and a
bad value is refused at the start with ``RUNTIME_CONFIG_INVALID``, changing nothing."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import re
import socket
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import orjson
import pytest
import uvicorn

from forgezero_lifecycle._errors import ConfigurationError
from forgezero_lifecycle._internals import uvicorn as _uvicorn
from forgezero_lifecycle.cli.main import build_parser, main
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.serve.options import (
    NOT_TAKEN,
    ServeOptions,
    UvicornOptions,
    check,
    config_arguments,
    configure_logging,
    loop_factory,
    options_from_args,
    options_from_wire,
)
from forgezero_lifecycle.serve.server import load_app, uvicorn_config
from tests.certificates import self_signed


def parse(*flags: str) -> argparse.Namespace:
    """``serve module:app FLAGS`` as the CLI parses it."""
    return build_parser().parse_args(["serve", "module:app", *flags])


async def plain_app(scope: Any, receive: Any, send: Any) -> None:
    """An ASGI app with nothing in it (the Config is looked at, never served)."""


#: What uvicorn before 0.36 defaulted ``ssl_ciphers`` to; giving no flag leaves it in place.
OLD_CIPHERS_DEFAULT: Final = "TLSv1"


def test_defaults_are_uvicorns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every field's default is ``uvicorn.Config``'s (``loop`` aside: asyncio, the loop the
    stop is tested on; and ``log_config``: serve's own format unless a file is given), so no
    flag given means no argument passed: uvicorn's own defaults."""
    monkeypatch.delenv("FORGEZERO_REVISION", raising=False)
    parameters = inspect.signature(uvicorn.Config).parameters
    assert UvicornOptions().loop == "asyncio"
    assert UvicornOptions().log_config is None
    compared = 0
    for field in dataclasses.fields(UvicornOptions):
        if field.name in ("loop", "log_config") or field.name not in parameters:
            continue  # serve's own default, or a flag this uvicorn lacks (check() refuses it)
        expected = parameters[field.name].default
        if field.name == "ssl_ciphers" and expected == OLD_CIPHERS_DEFAULT:
            continue
        actual = getattr(UvicornOptions(), field.name)
        assert actual == (() if expected is None and field.name == "headers" else expected), (
            field.name
        )
        compared += 1
    assert compared >= 25
    assert config_arguments(options_from_args(parse()).uvicorn) == {}


def test_flags_become_uvicorns_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each flag arrives in the ``uvicorn.Config`` every serving process builds, under
    uvicorn's name and with uvicorn's meaning (each flag the installed uvicorn has)."""
    monkeypatch.delenv("FORGEZERO_REVISION", raising=False)
    cert, key = self_signed(tmp_path)
    cases: list[tuple[tuple[str, ...], str, object]] = [
        (("--ssl-certfile", str(cert)), "ssl_certfile", str(cert)),
        (("--ssl-keyfile", str(key)), "ssl_keyfile", str(key)),
        (("--ssl-cert-reqs", "1"), "ssl_cert_reqs", ssl.CERT_OPTIONAL),
        (("--ssl-ca-certs", str(cert)), "ssl_ca_certs", str(cert)),
        (("--ssl-ciphers", "ECDHE+AESGCM"), "ssl_ciphers", "ECDHE+AESGCM"),
        (("--no-proxy-headers",), "proxy_headers", False),
        (("--forwarded-allow-ips", "10.0.0.0/8"), "forwarded_allow_ips", "10.0.0.0/8"),
        (("--timeout-keep-alive", "9"), "timeout_keep_alive", 9),
        (("--limit-concurrency", "50"), "limit_concurrency", 50),
        (("--backlog", "77"), "backlog", 77),
        (("--lifespan", "on"), "lifespan", "on"),
        (
            ("--header", "X-One:1", "--header", "X-Two: two:2"),
            "headers",
            [("X-One", "1"), ("X-Two", " two:2")],
        ),
        (("--no-server-header",), "server_header", False),
        (("--no-date-header",), "date_header", False),
        (("--ws-max-size", "1024"), "ws_max_size", 1024),
        (("--ws-max-queue", "7"), "ws_max_queue", 7),
        (("--ws-ping-interval", "3.5"), "ws_ping_interval", 3.5),
        (("--ws-ping-timeout", "4.5"), "ws_ping_timeout", 4.5),
        (("--ws-per-message-deflate", "false"), "ws_per_message_deflate", False),
        (("--h11-max-incomplete-event-size", "4096"), "h11_max_incomplete_event_size", 4096),
        (("--reset-contextvars",), "reset_contextvars", True),
        (("--use-colors",), "use_colors", True),
    ]
    parameters = inspect.signature(uvicorn.Config).parameters
    cases = [case for case in cases if case[1] in parameters]
    options = options_from_args(parse(*(flag for flags, _, _ in cases for flag in flags)))
    check(options.uvicorn)
    config = uvicorn_config(plain_app, options)
    expected = {name: value for _, name, value in cases}
    assert {name: getattr(config, name) for name in expected} == expected
    config.load()
    assert isinstance(config.ssl, ssl.SSLContext)
    assert config.ssl.verify_mode == ssl.CERT_OPTIONAL
    assert config.encoded_headers == [(b"x-one", b"1"), (b"x-two", b" two:2")]  # no Server


def test_flag_this_uvicorn_lacks_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag whose ``uvicorn.Config`` parameter the installed uvicorn lacks (an older one) is
    refused at the start, naming it, instead of failing in every worker."""

    class OldConfig:
        def __init__(self, app: object, backlog: int = 2048) -> None: ...

    monkeypatch.setattr(_uvicorn, "config_class", lambda: OldConfig)
    with pytest.raises(ConfigurationError, match="has no --reset-contextvars; upgrade uvicorn"):
        check(UvicornOptions(reset_contextvars=True))
    check(UvicornOptions(backlog=10))


def test_options_travel_to_workers_unchanged() -> None:
    """A worker reads its options from the channel (JSON): they arrive equal, headers too."""
    options = ServeOptions(
        workers=2,
        uvicorn=UvicornOptions(
            uds="/run/app.sock", headers=(("X-A", "b"),), ssl_keyfile_password="secret"
        ),
    )
    wire = orjson.loads(orjson.dumps(dataclasses.asdict(options)))
    assert options_from_wire(wire) == options


def test_password_is_not_in_the_options_repr() -> None:
    """The key's password never reaches a log line through the options' repr."""
    assert "hunter2" not in repr(
        ServeOptions(uvicorn=UvicornOptions(ssl_keyfile_password="hunter2"))
    )


def test_factory_is_called_before_the_runtime_is_looked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--factory``: the app is what the factory returns, and its runtime is found on it."""
    monkeypatch.delenv("FORGEZERO_REVISION", raising=False)
    runtime = Runtime(insecure_loopback_control=True)
    built = runtime.wrap(plain_app)
    app, found, source = load_app(lambda: built, ServeOptions(uvicorn=UvicornOptions(factory=True)))
    assert app is built
    assert found is runtime
    assert source == "app"


def test_env_file_is_loaded_before_the_tokens_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--env-file``: its variables are set before the flags read the environment (a token
    may come from it); a variable already set wins, as with uvicorn."""
    token = "t" * 43
    env_file = tmp_path / ".env"
    env_file.write_text(f"FORGEZERO_CONTROL_TOKEN={token}\nFZ_TEST_KEPT=from-file\n")
    monkeypatch.setenv("FORGEZERO_CONTROL_TOKEN", "placeholder")
    monkeypatch.delenv("FORGEZERO_CONTROL_TOKEN")
    monkeypatch.delenv("FORGEZERO_REVISION", raising=False)
    monkeypatch.setenv("FZ_TEST_KEPT", "from-environment")
    options = options_from_args(parse("--env-file", str(env_file)))
    assert options.control_token == token
    assert os.environ["FZ_TEST_KEPT"] == "from-environment"


def test_log_config_file_is_applied(tmp_path: Path) -> None:
    """``--log-config`` configures logging from the file, and uvicorn is given the file."""
    path = tmp_path / "logging.json"
    path.write_text(
        '{"version": 1, "disable_existing_loggers": false,'
        ' "loggers": {"fz.test.logconfig": {"level": "ERROR"}}}'
    )
    given = configure_logging(UvicornOptions(log_config=str(path)), {"version": 1})
    import logging

    assert given == str(path)
    assert logging.getLogger("fz.test.logconfig").level == logging.ERROR


def test_loop_names_are_uvicorns() -> None:
    """``--loop``: none is asyncio's default, asyncio a new asyncio loop, uvloop uvloop's, and
    module:attribute a factory of the user's."""
    import asyncio

    assert loop_factory("none") is None
    assert loop_factory("asyncio") is asyncio.new_event_loop
    uvloop = pytest.importorskip("uvloop")
    assert loop_factory("uvloop") is uvloop.new_event_loop
    assert loop_factory("auto") is uvloop.new_event_loop
    assert loop_factory("asyncio:new_event_loop") is asyncio.new_event_loop


def _refused(
    capsys: pytest.CaptureFixture[str], *flags: str, env: dict[str, str] | None = None
) -> str:
    """Run ``serve`` with ``flags``: exit 2 and the error line, which is returned."""
    code = main(["serve", "tests.serve.apps:app", "--insecure-loopback-control", *flags])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "RUNTIME_CONFIG_INVALID" in err, err
    return err


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (("--ssl-certfile", "/nonexistent/cert.pem"), "--ssl-certfile /nonexistent/cert.pem"),
        (("--ssl-keyfile", "key.pem"), "--ssl-keyfile needs --ssl-certfile"),
        (("--uds", "/tmp/x.sock", "--fd", "3"), "--uds or --fd"),
        (("--uds", "/tmp/x.sock", "--port", "8001"), "--uds replaces --host and --port"),
        (("--fd", "3", "--host", "0.0.0.0"), "--fd replaces --host and --port"),
        (("--env-file", "/nonexistent/.env"), "--env-file /nonexistent/.env"),
        (("--log-config", "/nonexistent/log.ini"), "--log-config /nonexistent/log.ini"),
        (("--loop", "nowhere"), "--loop takes"),
        (("--loop", "no_such_module:factory"), "--loop no_such_module:factory"),
        (("--limit-concurrency", "0"), "--limit-concurrency takes a positive number"),
        (("--ssl-cert-reqs", "5"), "--ssl-cert-reqs takes"),
        (("--header", ":value"), "--header takes Name:Value"),
        (("--workers", "2", "--fd", "999"), "--fd names fd 999"),
    ],
)
def test_bad_values_are_refused_at_the_start(
    capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], names: str
) -> None:
    """A value that cannot work is refused before anything starts, naming the flag."""
    assert names in _refused(capsys, *flags)


def test_tls_problems_are_refused_at_the_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key that does not match the certificate, a wrong key password or a cipher list
    OpenSSL cannot use: refused before a port is bound (the port stays free)."""
    cert, one_key = self_signed(tmp_path, "one")
    _, other_key = self_signed(tmp_path, "two")
    locked = tmp_path / "locked.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(other_key), "-out", str(locked), "-aes256",
         "-passout", "pass:right"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    tls = ("--port", port, "--ssl-certfile", str(cert))
    assert "TLS" in _refused(capsys, *tls, "--ssl-keyfile", str(other_key))
    assert "TLS" in _refused(
        capsys, *tls, "--ssl-keyfile", str(locked), "--ssl-keyfile-password", "wrong"
    )
    assert "TLS" in _refused(capsys, *tls, "--ssl-keyfile", str(one_key), "--ssl-ciphers", "NONE")
    assert "TLS" in _refused(capsys, *tls, "--workers", "2", "--ssl-keyfile", str(other_key))
    with socket.socket() as again:
        again.bind(("127.0.0.1", int(port)))  # nothing was bound: the port is free


def test_uds_in_use_is_refused_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--uds`` at a path a server listens on: refused, and that server keeps its socket; a
    refused ``--uds`` with ``--port`` creates nothing."""
    path = tmp_path / "app.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
        other.bind(str(path))
        other.listen(1)
        assert "listens on it already" in _refused(capsys, "--uds", str(path))
        assert path.exists()
    unused = tmp_path / "unused.sock"
    _refused(capsys, "--uds", str(unused), "--port", "8123")
    assert not unused.exists()


def test_check_passes_for_a_plain_config() -> None:
    """Nothing given, nothing refused."""
    check(UvicornOptions())


def test_value_errors_are_configuration_errors() -> None:
    """A bad value built in code is refused as the flag would be."""
    bad: list[Callable[[], object]] = [
        lambda: UvicornOptions(backlog=0),
        lambda: UvicornOptions(lifespan="maybe"),  # type: ignore[arg-type]
        lambda: UvicornOptions(timeout_keep_alive=-1),
    ]
    for build in bad:
        with pytest.raises(ConfigurationError):
            build()


SERVE_PAGE: Final = Path(__file__).resolve().parents[2] / "docs" / "serve.md"
#: What the table's second column starts with, and whether serve then takes the flag.
STATUSES: Final = {
    "supported": True,
    "own meaning": True,
    "not supported": False,
    "does not apply": False,
}


def _uvicorn_table() -> dict[str, str]:
    """docs/serve.md's table of uvicorn's options: each flag (and ``APP``) and its status."""
    text = SERVE_PAGE.read_text()
    start = text.index("| uvicorn | serve |")
    rows = text[start : text.index("\n\n", start)].splitlines()[2:]
    table: dict[str, str] = {}
    for row in rows:
        _, names, meaning, _ = row.split("|")
        status = next(s for s in STATUSES if meaning.strip().startswith(s))
        for name in re.findall(r"`(APP|--[a-z0-9-]+)`", names):
            assert name not in table, f"{name} twice"
            table[name] = status
    return table


def _uvicorns_options() -> set[str]:
    """Every option string of the installed uvicorn's command (``APP`` for its argument)."""
    names: set[str] = set()
    for param in uvicorn.main.params:
        if param.param_type_name == "argument":
            names.add("APP")
        else:
            names.update(param.opts, param.secondary_opts)
    return names


#: The uvicorn the table was written against: with it or a later one, the table must list
#: exactly its options (an older one, as ``make test-oldest`` installs, lacks some).
TABLE_UVICORN: Final = (0, 55)


def test_table_names_every_uvicorn_option() -> None:
    """docs/serve.md maps every option of the installed uvicorn, and no other: a new uvicorn
    option fails here until the table says what serve makes of it."""
    installed = _uvicorns_options()
    assert installed <= set(_uvicorn_table())
    if tuple(int(part) for part in _uvicorn.version().split(".")[:2]) >= TABLE_UVICORN:
        assert set(_uvicorn_table()) == installed


def _serve_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    return parser


def test_table_says_what_serve_takes() -> None:
    """A flag the table calls supported (or serve's own) is a flag of serve's; one it calls
    not supported or not applying is none, and ``serve --help`` names it among those not
    taken (``NOT_TAKEN``), for the same reason."""
    serve = _serve_parser()
    flags = {option for action in serve._actions for option in action.option_strings}
    not_taken = {flag for names, _ in NOT_TAKEN for flag in names}
    assert not_taken <= set(_uvicorn_table())
    for name, status in _uvicorn_table().items():
        if name == "APP":
            continue
        if STATUSES[status]:
            assert name in flags, f"{name} is {status} but not a flag of serve"
        else:
            assert name not in flags, f"{name} is a flag of serve, but the table says {status}"
            assert name in not_taken, f"{name}: serve --help does not say it is not taken"


def test_help_names_every_uvicorn_option() -> None:
    """``serve --help`` names each option of the installed uvicorn: as a flag of serve's, or
    among the ones not taken, with why."""
    text = _serve_parser().format_help()
    missing = [
        name
        for name in sorted(_uvicorns_options() - {"APP"})
        if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)
    ]
    assert missing == []
