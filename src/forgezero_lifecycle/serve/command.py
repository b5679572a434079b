"""``forgezero-lifecycle serve APP``: import the app, find or build its runtime, serve it."""

from __future__ import annotations

import asyncio
import os
import sys

from uvicorn.importer import import_from_string

from .._errors import ConfigurationError
from ..asgi._types import ASGIApp
from ..runtime import Runtime
from .options import ServeOptions
from .server import find_runtime, serve_app

__all__ = ["run"]


def run(app: str | ASGIApp, options: ServeOptions) -> int:
    """Import ``app`` (``"module:attribute"``) if needed, serve it, return the exit code.

    ``revision`` and ``not_ready_grace`` are exported as ``FORGEZERO_REVISION`` and
    ``FORGEZERO_NOT_READY_GRACE`` before the import, for apps that build their own runtime.
    """
    if options.revision is not None:
        os.environ["FORGEZERO_REVISION"] = options.revision
    if options.not_ready_grace:
        os.environ["FORGEZERO_NOT_READY_GRACE"] = repr(options.not_ready_grace)
    if isinstance(app, str):
        sys.path.insert(0, os.path.abspath(options.app_dir))
        try:
            app = import_from_string(app)
        except Exception as error:
            raise ConfigurationError(detail=f"cannot import the app {app!r}: {error}") from None
    assert not isinstance(app, str)
    runtime = find_runtime(app)
    if runtime is None:
        runtime = Runtime(
            control_token=options.control_token,
            handoff_token=options.handoff_token,
            revision=options.revision,
            not_ready_grace=options.not_ready_grace,
            stream_grace=options.stream_grace,
            insecure_loopback_control=options.insecure_loopback_control,
        )
        app = runtime.wrap(app)
    elif options.revision is not None and runtime.revision not in (None, options.revision):
        raise ConfigurationError(
            detail="--revision differs from the revision the app's runtime was built with"
        )
    return asyncio.run(serve_app(app, runtime, options))
