"""The handoff source rules in isolation: the loopback URL rule and the strict body decoding."""

from __future__ import annotations

import gzip

import pytest

from forgezero_lifecycle._errors import StateInputInvalidError, StateTransferFailedError
from forgezero_lifecycle.core._fetch import _Inflater, parse_document
from forgezero_lifecycle.core._loopback import loopback_source

# Inputs and their WHATWG serialisations beyond the vectors (the URL standard's own rules).
ACCEPTED = {
    "http://0x7f.1/": "http://127.0.0.1/",
    "http://0177.0.0.1/": "http://127.0.0.1/",
    "http://017700000001/": "http://127.0.0.1/",
    "http://127.0.0.0x1/": "http://127.0.0.1/",
    "http://%31%32%37.0.0.1/": "http://127.0.0.1/",
    "http://127.0.0.1:/": "http://127.0.0.1/",
    "http://127.0.0.1:0080/": "http://127.0.0.1/",
    "http://[::1]:80/": "http://[::1]/",
    "http://[::0.0.0.1]/": "http://[::1]/",
    "http://[0:0::0:1]": "http://[::1]/",
    "HTTP://LocalHost": "http://localhost/",
    "http://local\u00adhost/": "http://localhost/",
    "http://:@localhost/": "http://localhost/",
    "http:\\\\localhost\\a": "http://localhost/a",
    "http://127.0.0.1/a/./b/../c": "http://127.0.0.1/a/c",
    "http://127.0.0.1/%2e%2E/x": "http://127.0.0.1/x",
    "http://127.0.0.1/a/..": "http://127.0.0.1/",
    "http://127.0.0.1/a b{c}`d^e|f": "http://127.0.0.1/a%20b%7Bc%7D%60d%5Ee|f",
    "http://127.0.0.1?x y'\"<>`": "http://127.0.0.1/?x%20y%27%22%3C%3E`",
    "http://localhost:8080?#": "http://localhost:8080/?#",
    "http://localhost/\x7f\ud800": "http://localhost/%7F%EF%BF%BD",
}
REFUSED = [
    "http://127.0.0.2/",
    "http://0/",
    "http://127.0.0.256/",
    "http://1.2.3.4.5/",
    "http://127.0.0.1.../",
    "http://127.0.0.1%00/",
    "http://localhost\uff0e/",
    "http://xn--localhost/",
    "http://[::1]x/",
    "http://[::1",
    "http://[::ffff:127.0.0.1]/",
    "http://[::127.0.0.1]/",
    "http://[1::]/",
    "http://[::1%25lo]/",
    "http://a:@localhost/",
    "http://@@localhost/",
    "http://localhost@/",
    "http://localhost:99999/",
    "http://localhost:\uff18\uff10/",  # fullwidth digits are not ASCII digits
    "http://localhost:80:80/",
    "http://localhost/#x",
    "http://",
    "https://localhost/",
    "localhost/",
]


@pytest.mark.parametrize(("raw", "fetched"), ACCEPTED.items())
def test_loopback_urls_whatwg(raw: str, fetched: str) -> None:
    """The string fetched is the WHATWG serialisation of the source URL."""
    assert loopback_source(raw) == fetched


@pytest.mark.parametrize("raw", REFUSED)
def test_other_urls_invalid(raw: str) -> None:
    """Anything that does not serialise to http on a loopback name is SOURCE_INVALID."""
    with pytest.raises(StateInputInvalidError) as caught:
        loopback_source(raw)
    assert caught.value.code == "RUNTIME_STATE_SOURCE_INVALID"


@pytest.mark.parametrize(
    "body",
    [
        b"\xef\xbb\xbf\xef\xbb\xbf{}",  # a second BOM
        b'{"a":"\xc0\xaf"}',  # overlong UTF-8
        b'{"a":"\xed\xa0\x80"}',  # an encoded surrogate
        b'{"a":NaN}',
        b'{"a":-Infinity}',
        b"null",
        b"[]",
        b"",
        b'{"a":1} x',
        b'{"a":01}',
        b'{"a":"\x01"}',
        b"[" * 100_000,
    ],
)
def test_non_strict_json_invalid(body: bytes) -> None:
    """D6: strict UTF-8 and strict JSON with an object at the top level."""
    with pytest.raises(StateTransferFailedError) as caught:
        parse_document(body)
    assert caught.value.code == "RUNTIME_STATE_ENVELOPE_INVALID"


def test_bodies_parse_as_json_parse() -> None:
    """One BOM, lone surrogate escapes, big integers and doubles beyond range, as JSON.parse."""
    document = parse_document(b'\xef\xbb\xbf {"k\\ud800":[1e400,' + b"9" * 500 + b",1.0,-0]}\r\n")
    assert document == {"k\ud800": [float("inf"), float("inf"), 1.0, 0]}


def test_inflater_bounded_by_room() -> None:
    """One compressed chunk that would inflate to 64 MiB yields at most room + 1 bytes."""
    inflater = _Inflater("gzip")
    assert len(inflater.feed(gzip.compress(bytes(64 << 20)), 1000)) == 1001


def test_inflater_reads_members() -> None:
    """Two gzip members in one body decode to both parts, as zlib in Node does."""
    inflater = _Inflater("gzip")
    assert inflater.feed(gzip.compress(b"ab") + gzip.compress(b"cd"), 100) == b"abcd"
    assert inflater.finished


def test_ascii_host_mapping_is_idna() -> None:
    """For every ASCII code point, the host mapping without idna is idna's UTS #46 mapping."""
    import idna

    from forgezero_lifecycle.core._url_host import _uts46_remap

    for code in range(128):
        text = f"a{chr(code)}B"
        assert _uts46_remap(text) == idna.uts46_remap(text, std3_rules=False, transitional=False)
