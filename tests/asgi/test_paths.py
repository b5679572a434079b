"""app_path: the path inside the app, as every control-path match sees it."""

from __future__ import annotations

import pytest

from forgezero_lifecycle.asgi._paths import app_path


@pytest.mark.parametrize(
    ("path", "root_path", "expected"),
    [
        pytest.param("/.forgezero/runtime/ready", "", "/.forgezero/runtime/ready", id="no-root"),
        pytest.param(
            "/api/.forgezero/runtime/ready", "/api", "/.forgezero/runtime/ready", id="root"
        ),
        pytest.param("/other/x", "/api", "/other/x", id="root-not-a-prefix"),
    ],
)
def test_root_path_stripped(path: str, root_path: str, expected: str) -> None:
    """ASGI 3 servers put the mount prefix in both; a path outside it is left as it is."""
    assert app_path({"path": path, "root_path": root_path}) == expected


def test_no_root_path() -> None:
    """root_path is optional in a scope."""
    assert app_path({"path": "/x"}) == "/x"
