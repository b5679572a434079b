"""The app of ``bench.handoff``: a typed shop state of a chosen size, handed over by the runtime.

Both generations run this module (``uvicorn bench.apps.state:app``); the environment sets::

    FZ_BENCH_STATE_BYTES      size of the value's JSON to export (the old generation's state)
    FORGEZERO_CONTROL_TOKEN   control token (≥ 16 characters)
    FORGEZERO_HANDOFF_TOKEN   export token (43 URL-safe characters)
    FORGEZERO_REVISION        this generation's revision (40 hex)
    FZ_BENCH_PAUSE_COLLECTOR  "1": Runtime(handoff_pauses_collector=True); else the default

The value is ``bench.canonical.build_state`` (carts of a shop) typed by pydantic models, so the
handoff pays what a real typed state pays: dump, canonical JSON, digest, validation. Besides the
control plane it serves two benchmark routes, exempt from the drain:

* ``GET /bench/blob``: the value's JSON bytes, prepared at startup (the baseline transfer);
* ``GET /bench/handoff-wait?nonce=``: returns the handoff status once it is acknowledged or
  failed (``StateHandoffController.wait``), so the benchmark never polls;
* ``POST /bench/next-state``: the same state with ``generation`` one higher, so the next export
  serves a value JSON this generation has never exported (and checks it, as a first export does).
"""

from __future__ import annotations

import os

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bench.apps.shop import ShopState, sized_state
from forgezero_lifecycle.runtime import Runtime
from forgezero_lifecycle.wire.handoff import MAX_STATE_BYTES, StateImportContext


class ShopAdapter:
    """The state adapter: exports the current state, imports by replacing it."""

    protocol = "bench.shop"
    schema_version = 1
    maximum_bytes = MAX_STATE_BYTES
    model = ShopState

    def __init__(self, state: ShopState | None) -> None:
        self.state = state

    async def export_state(self) -> tuple[str, ShopState]:
        assert self.state is not None
        return f"carts-{len(self.state.carts)}", self.state

    async def import_state(self, value: ShopState, context: StateImportContext) -> None:
        self.state = value


size = int(os.environ.get("FZ_BENCH_STATE_BYTES", "0"))
adapter = ShopAdapter(sized_state(size) if size else None)
blob = orjson.dumps(adapter.state.model_dump(mode="json")) if adapter.state else b"{}"
runtime = Runtime(
    control_token=os.environ["FORGEZERO_CONTROL_TOKEN"],
    handoff_token=os.environ["FORGEZERO_HANDOFF_TOKEN"],
    revision=os.environ["FORGEZERO_REVISION"],
    state_adapter=adapter,
    handoff_pauses_collector=os.environ.get("FZ_BENCH_PAUSE_COLLECTOR") == "1",
    exempt=lambda scope: scope["path"].startswith("/bench/"),
)


async def serve_blob(request: Request) -> Response:
    return Response(blob, media_type="application/json")


async def handoff_wait(request: Request) -> Response:
    assert runtime.handoff is not None
    status = await runtime.handoff.wait(request.query_params.get("nonce"))
    return JSONResponse(status.model_dump(mode="json", exclude_none=True))


async def next_state(request: Request) -> Response:
    assert adapter.state is not None
    adapter.state = adapter.state.model_copy(update={"generation": adapter.state.generation + 1})
    return Response(status_code=204)


app = Starlette(
    routes=[
        Route("/bench/blob", serve_blob),
        Route("/bench/handoff-wait", handoff_wait),
        Route("/bench/next-state", next_state, methods=["POST"]),
    ]
)
runtime.install(app)
