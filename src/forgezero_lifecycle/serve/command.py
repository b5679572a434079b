"""``forgezero-lifecycle serve APP``: import the app, find or build its runtime, serve it.

Without ``--workers`` this process serves the app itself; with ``--workers N`` it becomes the
supervisor of :mod:`.supervisor`, and every worker process it starts runs :func:`load_app`
anew (so each generation imports the code on disk at its start).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import traceback
from typing import Final, Literal

from .._errors import ConfigurationError
from .._internals import uvicorn as _uvicorn
from ..asgi._types import ASGIApp
from ..runtime import Runtime
from .listeners import own_listeners
from .options import ServeOptions, check, configure_logging, load_env_file, loop_factory
from .server import find_runtime, log_config, serve_app

__all__ = ["load_app", "run"]

logger = logging.getLogger("forgezero_lifecycle.serve")

#: The graces of a runtime ``serve`` builds when no flag gives them (the ``Runtime`` defaults).
DEFAULT_NOT_READY_GRACE: Final = 0.0
DEFAULT_STREAM_GRACE: Final = 5.0


def run(app: str | ASGIApp, options: ServeOptions) -> int:
    """Import ``app`` (``"module:attribute"``) if needed, serve it, return the exit code.

    One rule (docs/serve.md, "serve's flags and an app's own runtime"): the runtime flags
    configure the runtime ``serve`` serves, and are never silently ignored. They are exported
    first (``FORGEZERO_REVISION``, ``FORGEZERO_NOT_READY_GRACE``, ``FORGEZERO_STREAM_GRACE``);
    an app without a runtime gets one built from them; an app that builds its own reads them
    from the environment (as examples/quickstart/main.py does), and every flag given must agree
    with the runtime it built, or ``serve`` refuses to start.
    """
    flags = options.uvicorn
    if flags.env_file is not None:
        load_env_file(flags.env_file)  # loaded by the CLI already; existing variables win
    check(flags)  # every uvicorn flag, before anything is bound or started
    if options.workers is not None:
        if not isinstance(app, str):
            raise ConfigurationError(detail="--workers needs the app as 'module:attribute'")
        from .supervisor import run_supervisor

        return run_supervisor(app, options)
    configure_logging(flags, log_config(options.log_level, options.log_label))
    # systemd socket activation, --uds or --fd; else uvicorn binds host:port
    given = own_listeners(uds=flags.uds, fd=flags.fd, backlog=flags.backlog)
    sockets = None if not given else [listener.sock for listener in given]
    for listener in given or ():
        logger.info("serve.listening on %s", listener.describe())  # uvicorn says it of its own
    try:
        loaded, runtime, source = load_app(app, options)
        with asyncio.Runner(loop_factory=loop_factory(flags.loop)) as runner:
            return runner.run(
                serve_app(loaded, runtime, options, sockets=sockets, runtime_source=source)
            )
    finally:
        for listener in given or ():
            listener.close()


def load_app(
    app: str | ASGIApp, options: ServeOptions
) -> tuple[ASGIApp, Runtime, Literal["app", "serve"]]:
    """The app (imported when given as a string), its runtime (built from the flags when it has
    none), and where the runtime came from."""
    _export(options)
    if isinstance(app, str):
        app = _import(app, options.app_dir)
    if options.uvicorn.factory:
        app = _call_factory(app)
    runtime = find_runtime(app)
    if runtime is None:
        runtime = Runtime(
            control_token=options.control_token,
            handoff_token=options.handoff_token,
            revision=options.revision,
            not_ready_grace=_or(options.not_ready_grace, DEFAULT_NOT_READY_GRACE),
            stream_grace=_or(options.stream_grace, DEFAULT_STREAM_GRACE),
            insecure_loopback_control=options.insecure_loopback_control,
        )
        return runtime.wrap(app), runtime, "serve"
    _check_agrees(runtime, options)
    return app, runtime, "app"


def _export(options: ServeOptions) -> None:
    if options.revision is not None:
        os.environ["FORGEZERO_REVISION"] = options.revision
    if options.not_ready_grace is not None:
        os.environ["FORGEZERO_NOT_READY_GRACE"] = repr(options.not_ready_grace)
    if options.stream_grace is not None:
        os.environ["FORGEZERO_STREAM_GRACE"] = repr(options.stream_grace)


def _import(target: str, app_dir: str) -> ASGIApp:
    sys.path.insert(0, os.path.abspath(app_dir))
    try:
        app: ASGIApp = _uvicorn.import_from_string(target)
    except _uvicorn.import_error() as error:  # no such module or attribute: uvicorn says which
        raise ConfigurationError(detail=f"cannot import the app {target!r}: {error}") from None
    except Exception as error:
        traceback.print_exc()  # the app's own code failed: its traceback says where
        raise ConfigurationError(
            detail=f"importing the app {target!r} raised {type(error).__name__}: {error}"
        ) from None
    return app


def _call_factory(factory: object) -> ASGIApp:
    """``--factory``: the app is what the factory returns (before serve looks for its runtime)."""
    if not callable(factory):
        raise ConfigurationError(detail="--factory: the app is not callable")
    try:
        app: ASGIApp = factory()
    except Exception as error:
        traceback.print_exc()  # the factory's own code failed: its traceback says where
        raise ConfigurationError(
            detail=f"--factory: calling the app factory raised {type(error).__name__}: {error}"
        ) from None
    return app


def _check_agrees(runtime: Runtime, options: ServeOptions) -> None:
    given = (
        ("--revision", options.revision, runtime.revision),
        ("--not-ready-grace", options.not_ready_grace, runtime.not_ready_grace),
        ("--stream-grace", options.stream_grace, runtime.stream_grace),
    )
    ignored = [
        f"{flag} {value} (the runtime has {actual})"
        for flag, value, actual in given
        if value is not None and value != actual
    ]
    if ignored:
        raise ConfigurationError(
            detail="the app builds its own runtime, which does not use "
            + ", ".join(ignored)
            + ": build it from the settings serve exports (FORGEZERO_REVISION, "
            "FORGEZERO_NOT_READY_GRACE, FORGEZERO_STREAM_GRACE), as the README's Quick start "
            "does, or drop the flags"
        )


def _or(value: float | None, default: float) -> float:
    return default if value is None else value
