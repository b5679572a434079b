"""The loopback rule for handoff sources, on a WHATWG URL parse of ``http`` URLs.

The rule is the JavaScript `@forgezero/runtime` lifecycle module's.

The JavaScript module runs ``new URL(raw)`` and accepts the URL when its protocol is ``http:``, it
carries no username, password or fragment, and its hostname is ``127.0.0.1``, ``[::1]``, ``::1`` or
``localhost``; it then fetches ``url.toString()``. So what counts is the *normalised* URL:
``http://127.1/``, ``http://2130706433/``, fullwidth ``localhost`` and ``http:127.0.0.1/x`` are all
accepted, and the string fetched is the serialisation (``http://127.0.0.1/``...).

This module implements the WHATWG URL standard's basic URL parser for the one scheme it needs
(``http``, a special scheme, with no base URL): trimming, scheme, authority, userinfo, host (in
:mod:`._url_host`), port, path with dot segments, query and fragment percent-encoding, and
serialisation. Any input the standard rejects, any other scheme and any host that does not serialise
to one of the three loopback names raise :class:`StateInputInvalidError`
``RUNTIME_STATE_SOURCE_INVALID``, a code, never the parser's text.

Port rules D1-D9 are listed in ``tests/conformance/vectors.json``, ``meta.format_notes.port_rules``.
"""

from __future__ import annotations

import re
from typing import Final

from .._errors import StateInputInvalidError
from ._url_host import UrlInvalidError, parse_host

__all__ = ["loopback_source"]

_LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "[::1]", "::1", "localhost"})
_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+\-.]*:")
_C0_OR_SPACE: Final = "".join(map(chr, range(0x21)))
_QUERY_SET: Final = frozenset(' "#<>')
_SPECIAL_QUERY_SET: Final = _QUERY_SET | {"'"}
_PATH_SET: Final = _QUERY_SET | frozenset("?^`{}")
_SINGLE_DOT: Final = frozenset({".", "%2e"})
_DOUBLE_DOT: Final = frozenset({"..", ".%2e", "%2e.", "%2e%2e"})


def loopback_source(raw: str) -> str:
    """Return the normalised URL to fetch, or raise ``RUNTIME_STATE_SOURCE_INVALID``."""
    try:
        host, url = _parse_http(raw)
    except UrlInvalidError:
        raise StateInputInvalidError(
            "RUNTIME_STATE_SOURCE_INVALID", "the source URL is not a valid http URL"
        ) from None
    if host not in _LOOPBACK_HOSTS:
        raise StateInputInvalidError(
            "RUNTIME_STATE_SOURCE_INVALID",
            "the source must be http on 127.0.0.1, [::1] or localhost, without credentials "
            "or fragment",
        )
    return url


def _parse_http(raw: str) -> tuple[str, str]:
    """Parse ``raw``; return (host, serialisation) of an http URL with no credentials."""
    # A JavaScript string reaches the parser as a USVString: lone surrogates become U+FFFD.
    text = raw.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    text = text.strip(_C0_OR_SPACE).replace("\t", "").replace("\n", "").replace("\r", "")
    scheme = _SCHEME.match(text)
    if scheme is None or scheme.group().lower() != "http:":
        raise UrlInvalidError
    rest = text[scheme.end() :].lstrip("/\\")
    end = _first_of(rest, "/\\?#")
    authority, rest = rest[:end], rest[end:]
    at = authority.rfind("@")
    if at >= 0:
        # Only an empty username and password pass the JavaScript module's rule; "" and ":" encode
        # to them.
        if authority[:at] not in ("", ":"):
            raise UrlInvalidError
        authority = authority[at + 1 :]
    host_text, port = _split_port(authority)
    host = parse_host(host_text)
    path, query, fragment = _path_query_fragment(rest)
    if fragment:
        raise UrlInvalidError
    url = "http://" + host + ("" if port is None else f":{port}") + path
    if query is not None:
        url += "?" + query
    if fragment is not None:
        url += "#"
    return host, url


def _first_of(text: str, stops: str) -> int:
    return next((i for i, c in enumerate(text) if c in stops), len(text))


def _split_port(authority: str) -> tuple[str, int | None]:
    inside_brackets = False
    for i, c in enumerate(authority):
        if c == "[":
            inside_brackets = True
        elif c == "]":
            inside_brackets = False
        elif c == ":" and not inside_brackets:
            digits = authority[i + 1 :]
            if i == 0 or any(d not in "0123456789" for d in digits):
                raise UrlInvalidError
            port = int(digits) if digits else None
            if port is not None and port > 65535:
                raise UrlInvalidError
            return authority[:i], None if port == 80 else port
    if not authority:
        raise UrlInvalidError
    return authority, None


def _path_query_fragment(rest: str) -> tuple[str, str | None, str | None]:
    end = _first_of(rest, "?#")
    path_text, rest = rest[:end], rest[end:]
    query: str | None = None
    fragment: str | None = None
    if rest.startswith("?"):
        hash_at = _first_of(rest, "#")
        query = _encode(rest[1:hash_at], _SPECIAL_QUERY_SET)
        rest = rest[hash_at:]
    if rest.startswith("#"):
        fragment = rest[1:]
    if path_text[:1] in ("/", "\\"):
        path_text = path_text[1:]
    segments = re.split(r"[/\\]", path_text)
    path: list[str] = []
    for k, segment in enumerate(segments):
        last = k == len(segments) - 1
        if segment.lower() in _DOUBLE_DOT:
            if path:
                path.pop()
            if last:
                path.append("")
        elif segment.lower() in _SINGLE_DOT:
            if last:
                path.append("")
        else:
            path.append(_encode(segment, _PATH_SET))
    return "/" + "/".join(path), query, fragment


def _encode(text: str, encode_set: frozenset[str]) -> str:
    return "".join(
        "".join(f"%{b:02X}" for b in c.encode("utf-8"))
        if c in encode_set or not " " <= c <= "~"
        else c
        for c in text
    )
