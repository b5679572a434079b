"""serve's flag defaults are written once, in ``ServeOptions``, and the flags' help says them."""

from __future__ import annotations

import argparse
import dataclasses

from forgezero_lifecycle.serve.options import ServeOptions, add_arguments


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def test_flag_defaults_are_the_options_defaults() -> None:
    """Every flag left out parses to the ``ServeOptions`` field's default (the flags whose
    field differs in name or sense are named)."""
    args = vars(_parser().parse_args(["module:app"]))
    fields = {field.name: field.default for field in dataclasses.fields(ServeOptions)}
    renamed = {"access_log": ("no_access_log", False)}
    checked = 0
    for name, default in fields.items():
        if name in renamed:
            dest, expected = renamed[name]
            assert args[dest] is expected
        elif name in args:
            assert args[name] == default, name
        else:
            continue
        checked += 1
    assert checked >= 15  # every flag with a default of its own


def test_help_says_the_defaults() -> None:
    """The help text is written from the same defaults (``30s``, ``1s``, ``127.0.0.1``)."""
    text = " ".join(_parser().format_help().split())
    options = ServeOptions()
    assert f"default: {options.host}" in text
    assert f"(default {options.drain_timeout:g}s)" in text
    assert f"(default {options.start_timeout:g}s)" in text
    assert f"(default {options.first_byte_grace:g}s)" in text
