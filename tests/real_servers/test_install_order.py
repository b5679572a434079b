"""Middleware added after runtime.install stays inside the runtime, over real sockets.

The test app adds its ``Teapot`` middleware after ``runtime.install(app)``: it answers 418 to
any request with an ``x-teapot`` header, whatever the path.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from ._control import PREFIX, WireControl

pytestmark = [pytest.mark.server, pytest.mark.anyio]


async def test_probes_not_shadowed(http: httpx.AsyncClient, control: WireControl) -> None:
    """Middleware added after install cannot shadow the probes: /ready and /live are answered by the
    runtime; the teapot gets every other path."""
    teapot = {"x-teapot": "0"}
    assert (await http.get(PREFIX + "/ready", headers=teapot)).status_code == 200
    assert (await http.get(PREFIX + "/live", headers=teapot)).status_code == 200
    assert (await http.get("/fast", headers=teapot)).status_code == 418


async def test_late_middleware_counted(http: httpx.AsyncClient, control: WireControl) -> None:
    """A request inside a middleware added after install is counted: one the later middleware holds
    is in flight for the drain, which waits for it."""
    held = asyncio.create_task(http.get("/fast", headers={"x-teapot": "0.8"}))
    await control.wait_admitted("http")
    nonce = await control.begin()

    during = await control.status(nonce)
    assert (await held).status_code == 418
    after = await control.wait_for_status(nonce, "drained", "failed")

    assert (during["status"], during["inFlight"]["http"]) == ("draining", 1)
    assert after["status"] == "drained"
    assert after["inFlight"]["http"] == 0
