"""The state of a generation, handed over worker by worker to the next one (``serve --workers``).

State (when the app has a state adapter): worker k of g hands its state to worker k of g+1, once
g is drained (so the export is final), through the state export protocol over a private loopback
listener each worker has of its own, with the handoff token. Generations have the same number of
workers; a handover whose new workers have no adapter, another protocol or schema version, or
that has no handoff token is refused before g is touched (logged; g keeps serving: the
refusal is :func:`~forgezero_lifecycle.serve.machine.state_refusal`). The new
generation serves while the state is on its way: an adapter's import must merge with what the
new worker did meanwhile (a counter adds).

One deadline bounds each worker's transfer: the drain's (``--drain-timeout``). The new worker's
import (the fetch of the export, however slow the old worker's adapter, and the import) gives
up when it passes, and the supervisor waits for its answer that long plus the channel's usual
bound (:func:`~forgezero_lifecycle.serve.workers.answer_bound`), so an export that
arrives in time is never logged as failed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from urllib.parse import urlencode

from ..core.self_drain import UNKNOWN_REVISION
from ..wire import paths
from ..wire._protocol import deadline_ms
from .options import ServeOptions
from .workers import Generation, WorkerHandle

__all__ = ["hand_state_over"]

logger = logging.getLogger("forgezero_lifecycle.serve.supervisor")


async def hand_state_over(
    old: Generation,
    new: Generation,
    options: ServeOptions,
    pairs: tuple[tuple[int, int], ...] = (),
) -> None:
    """Each worker of ``old`` hands its state to its partner in ``new`` (``pairs`` of places, as
    the supervisor's machine decided; by default worker k to worker k)."""
    source = old.revision or UNKNOWN_REVISION
    target = new.revision or UNKNOWN_REVISION
    timeout_ms = deadline_ms(options.drain_timeout)

    async def one(before: WorkerHandle, after: WorkerHandle) -> None:
        assert before.state_kind is not None
        query = urlencode({"sourceRevision": source, "targetRevision": target})
        request = {
            "protocol": before.state_kind["protocol"],
            "nonce": secrets.token_urlsafe(32),
            "schemaVersion": before.state_kind["schemaVersion"],
            "sourceRevision": source,
            "targetRevision": target,
            "source": {
                "url": f"http://127.0.0.1:{before.private_port}{paths.RUNTIME_STATE_EXPORT_PATH}?{query}",
                "authorization": f"Bearer {options.handoff_token}",
            },
        }
        answer = await after.command("import", request=request, timeoutMs=timeout_ms)
        status = answer.get("status", {})
        if status.get("status") == "acknowledged":
            logger.info(
                "supervisor.state_handed_over worker=%d cursor=%s",
                after.index,
                status.get("cursor"),
            )
        else:
            logger.error(
                "supervisor.state_handoff_failed worker=%d failure=%s",
                after.index,
                status.get("failure") or answer.get("error"),
            )

    if not pairs:
        pairs = tuple((index, index) for index in range(len(old.workers)))
    await asyncio.gather(*(one(old.workers[b], new.workers[a]) for b, a in pairs))
