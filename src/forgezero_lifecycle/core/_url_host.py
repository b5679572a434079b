"""The host of a special URL, parsed and serialised as the WHATWG URL standard does.

IPv6 addresses in brackets (compressed on output), IPv4 in every form the standard reads
(``127.1``, ``0x7f.1``, ``2130706433``, ``0177.0.0.1``, a trailing dot), and domains through
percent-decoding and UTS #46 mapping (``LOCALHOST``, fullwidth letters, a soft hyphen). Domains
that stay non-ASCII or hold an ``xn--`` label are refused rather than Punycode-encoded: the
caller accepts only loopback names, and no such domain can serialise to one.
"""

from __future__ import annotations

from typing import Final

__all__ = ["UrlInvalidError", "parse_host"]

_HEX: Final = frozenset("0123456789abcdefABCDEF")
_DIGITS: Final = frozenset("0123456789")
_OCTAL: Final = frozenset("01234567")
_FORBIDDEN_HOST: Final = frozenset("\x00\t\n\r #/:<>?@[\\]^|")
_FORBIDDEN_DOMAIN: Final = _FORBIDDEN_HOST | frozenset(map(chr, range(0x20))) | {"%", "\x7f"}


class UrlInvalidError(Exception):
    """The WHATWG parser returned failure."""


def _uts46_remap(domain: str) -> str:
    """UTS #46 mapping (``UseSTD3ASCIIRules`` and ``Transitional_Processing`` false), as the
    WHATWG "domain to ASCII" does first.

    For ASCII text that mapping is lowercasing: under those flags UTS #46 maps A-Z to a-z and
    keeps every other ASCII code point (``tests/core/test_handoff_source.py`` checks all 128
    against idna). So idna (0.4 MiB resident, with its tables) is imported only for a non-ASCII
    host, which a loopback source never has once mapped.
    """
    if domain.isascii():
        return domain.lower()
    import idna

    try:
        return idna.uts46_remap(domain, std3_rules=False, transitional=False)
    except (idna.IDNAError, ValueError):
        raise UrlInvalidError from None


def parse_host(text: str) -> str:
    """The serialised host of a special URL (``http``), or raise :class:`UrlInvalidError`."""
    if text.startswith("["):
        if not text.endswith("]"):
            raise UrlInvalidError
        return "[" + _ipv6_serialize(_ipv6_parse(text[1:-1])) + "]"
    domain = _percent_decode(text).decode("utf-8", "replace")
    mapped = _uts46_remap(domain)
    # A label left non-ASCII becomes "xn--...", and an "xn--" label stays one: neither is ever
    # a loopback name or an IPv4 number, so both are refused here without Punycode.
    if not mapped or not mapped.isascii() or any(s.startswith("xn--") for s in mapped.split(".")):
        raise UrlInvalidError
    if any(c in _FORBIDDEN_DOMAIN for c in mapped):
        raise UrlInvalidError
    if _ends_in_number(mapped):
        address = _ipv4_parse(mapped)
        return ".".join(str(address >> shift & 0xFF) for shift in (24, 16, 8, 0))
    return mapped


def _percent_decode(text: str) -> bytes:
    data = text.encode("utf-8")
    out = bytearray()
    i = 0
    while i < len(data):
        byte = data[i]
        pair = data[i + 1 : i + 3].decode("latin-1")
        if byte == 0x25 and len(pair) == 2 and all(c in _HEX for c in pair):
            out.append(int(pair, 16))
            i += 3
        else:
            out.append(byte)
            i += 1
    return bytes(out)


def _ends_in_number(domain: str) -> bool:
    parts = domain.split(".")
    if parts[-1] == "":
        if len(parts) == 1:
            return False
        parts.pop()
    last = parts[-1]
    if last and all(c in _DIGITS for c in last):
        return True
    return _ipv4_number(last) is not None


def _ipv4_number(part: str) -> int | None:
    if not part:
        return None
    digits, radix = _DIGITS, 10
    if part[:2] in ("0x", "0X"):
        part, digits, radix = part[2:], _HEX, 16
    elif len(part) >= 2 and part[0] == "0":
        part, digits, radix = part[1:], _OCTAL, 8
    if not part:
        return 0
    if any(c not in digits for c in part):
        return None
    return int(part, radix)


def _ipv4_parse(domain: str) -> int:
    parts = domain.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    if len(parts) > 4:
        raise UrlInvalidError
    numbers: list[int] = []
    for part in parts:
        number = _ipv4_number(part)
        if number is None:
            raise UrlInvalidError
        numbers.append(number)
    if any(n > 255 for n in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(numbers)):
        raise UrlInvalidError
    address = numbers[-1]
    for i, n in enumerate(numbers[:-1]):
        address += n * 256 ** (3 - i)
    return address


def _ipv6_parse(text: str) -> list[int]:
    address = [0] * 8
    piece = 0
    compress: int | None = None
    i = 0
    n = len(text)

    def at(k: int) -> str:
        return text[k] if k < n else ""

    if at(0) == ":":
        if at(1) != ":":
            raise UrlInvalidError
        i, piece, compress = 2, 1, 1
    while i < n:
        if piece == 8:
            raise UrlInvalidError
        if text[i] == ":":
            if compress is not None:
                raise UrlInvalidError
            i += 1
            piece += 1
            compress = piece
            continue
        value = length = 0
        while length < 4 and at(i) in _HEX:
            value = value * 16 + int(text[i], 16)
            i += 1
            length += 1
        if at(i) == ".":
            if length == 0 or piece > 6:
                raise UrlInvalidError
            i -= length
            piece = _ipv6_embedded_ipv4(text, i, address, piece)
            i = n
            break
        if at(i) == ":":
            i += 1
            if i == n:
                raise UrlInvalidError
        elif i < n:
            raise UrlInvalidError
        address[piece] = value
        piece += 1
    if compress is not None:
        swaps = piece - compress
        piece = 7
        while piece != 0 and swaps > 0:
            other = compress + swaps - 1
            address[piece], address[other] = address[other], address[piece]
            piece -= 1
            swaps -= 1
    elif piece != 8:
        raise UrlInvalidError
    return address


def _ipv6_embedded_ipv4(text: str, i: int, address: list[int], piece: int) -> int:
    numbers_seen = 0
    while i < len(text):
        if numbers_seen > 0:
            if text[i] != "." or numbers_seen >= 4:
                raise UrlInvalidError
            i += 1
        if i >= len(text) or text[i] not in _DIGITS:
            raise UrlInvalidError
        value: int | None = None
        while i < len(text) and text[i] in _DIGITS:
            if value == 0:
                raise UrlInvalidError
            value = int(text[i]) if value is None else value * 10 + int(text[i])
            if value > 255:
                raise UrlInvalidError
            i += 1
        assert value is not None
        address[piece] = address[piece] * 0x100 + value
        numbers_seen += 1
        if numbers_seen in (2, 4):
            piece += 1
    if numbers_seen != 4:
        raise UrlInvalidError
    return piece


def _ipv6_serialize(address: list[int]) -> str:
    compress: int | None = None
    best = 1
    i = 0
    while i < 8:
        if address[i] == 0:
            j = i
            while j < 8 and address[j] == 0:
                j += 1
            if j - i > best:
                compress, best = i, j - i
            i = j
        else:
            i += 1
    out = ""
    ignore_zero = False
    for k, piece in enumerate(address):
        if ignore_zero and piece == 0:
            continue
        ignore_zero = False
        if compress == k:
            out += "::" if k == 0 else ":"
            ignore_zero = True
            continue
        out += f"{piece:x}" + (":" if k != 7 else "")
    return out
