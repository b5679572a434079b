"""Bearer tokens: the form each token must have, and reading one from a file or the environment.

A **control token** travels as ``Authorization: Bearer <token>``, so it must be an RFC 6750
§2.1 ``b64token`` (ASCII letters, digits and ``-._~+/``, then optional ``=``) of at least
:data:`MIN_CONTROL_TOKEN_CHARS` characters. A **handoff token** also travels inside the
``source.authorization`` field of a handoff request, which the wire restricts to exactly 43
base64url characters (``secrets.token_urlsafe(32)``); a handoff token of any other form could
never be sent. The two tokens must differ: the handoff token is handed to the new generation,
the control token must not be.

Placeholders such as the ones in ``examples/kubernetes/deployment.yaml`` start with
``REPLACE`` and contain spaces, so they cannot pass; using one says so.

:func:`read_token` is what the command line uses: a token file holds one line (a final newline
is fine), nothing that a header cannot carry, and should be readable by its owner only.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from ._errors import ConfigurationError

__all__ = [
    "GENERATE_HINT",
    "HANDOFF_TOKEN_PATTERN",
    "MIN_CONTROL_TOKEN_CHARS",
    "check_control_token",
    "check_handoff_token",
    "check_token_pair",
    "read_token",
]

MIN_CONTROL_TOKEN_CHARS: Final = 16
#: RFC 6750 §2.1 ``b64token``: what a bearer token may look like.
_B64TOKEN: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
#: The only handoff token ``source.authorization`` can carry (``Bearer <43 base64url>``).
HANDOFF_TOKEN_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{43}")
GENERATE_HINT: Final = (
    'generate one with: python -c "import secrets; print(secrets.token_urlsafe(32))"'
)
_PLACEHOLDER: Final = "REPLACE"


def _placeholder(name: str) -> ConfigurationError:
    return ConfigurationError(
        detail=f"{name} is still a placeholder from an example; {GENERATE_HINT}"
    )


def check_control_token(token: str, name: str = "control_token") -> None:
    """Raise :class:`ConfigurationError` unless ``token`` can work as a control token."""
    if not isinstance(token, str):
        raise ConfigurationError(detail=f"{name} must be a str, not {type(token).__name__}")
    if _B64TOKEN.fullmatch(token) is None:
        if token.startswith(_PLACEHOLDER):
            raise _placeholder(name)
        raise ConfigurationError(
            detail=f"{name} may hold only ASCII letters, digits and -._~+/ (then =), as a "
            f"bearer token must (RFC 6750); {GENERATE_HINT}"
        )
    if len(token) < MIN_CONTROL_TOKEN_CHARS:
        raise ConfigurationError(
            detail=f"{name} must be at least {MIN_CONTROL_TOKEN_CHARS} characters; {GENERATE_HINT}"
        )


def check_handoff_token(token: str, name: str = "handoff_token") -> None:
    """Raise :class:`ConfigurationError` unless ``token`` is 43 base64url characters."""
    if not isinstance(token, str):
        raise ConfigurationError(detail=f"{name} must be a str, not {type(token).__name__}")
    if HANDOFF_TOKEN_PATTERN.fullmatch(token) is None:
        if token.startswith(_PLACEHOLDER):
            raise _placeholder(name)
        raise ConfigurationError(
            detail=f"{name} must be exactly 43 base64url characters (A-Z a-z 0-9 - _), the "
            f"only form a handoff request can carry; {GENERATE_HINT}"
        )


def check_token_pair(control_token: str | None, handoff_token: str | None) -> None:
    """Both tokens valid, and not the same one."""
    if control_token is not None:
        check_control_token(control_token)
    if handoff_token is not None:
        check_handoff_token(handoff_token)
    if control_token is not None and control_token == handoff_token:
        raise ConfigurationError(
            detail="handoff_token must differ from control_token: the handoff token is given "
            "to the new generation, the control token must not be"
        )


def read_token(
    env: str,
    path: Path | None,
    *,
    flag: str,
    handoff: bool = False,
    environ: Mapping[str, str] | None = None,
    warn: Callable[[str], object] | None = None,
) -> str | None:
    """The token from the file ``path`` when given, else from ``$env``; ``None`` when unset.

    Surrounding whitespace (the final newline of a file) is dropped. A token that spans
    several lines, or holds anything a bearer header cannot carry, raises
    :class:`ConfigurationError` without echoing it. A file that group or others may read gets
    a warning through ``warn`` (default: one line on stderr).
    """
    if path is not None:
        text = path.read_text(encoding="utf-8", errors="replace")
        source = f"the token file {path} ({flag})"
        _warn_if_shared(path, warn or _stderr)
    else:
        text = (os.environ if environ is None else environ).get(env, "")
        source = env
    token = text.strip()
    if not token:
        return None
    if token.startswith(_PLACEHOLDER):
        raise _placeholder(source)
    if any(c.isspace() for c in token):
        raise ConfigurationError(
            detail=f"{source} holds more than one line or word; put the token alone on one line"
        )
    if handoff:
        check_handoff_token(token, name=source)
    else:
        check_control_token(token, name=source)
    return token


def _warn_if_shared(path: Path, warn: Callable[[str], object]) -> None:
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        warn(
            f"{path} is accessible by group or others (mode {stat.S_IMODE(mode):04o}); "
            f"a token file should be private: chmod 600 {path}"
        )


def _stderr(message: str) -> None:
    print(f"forgezero-lifecycle: warning: {message}", file=sys.stderr)
