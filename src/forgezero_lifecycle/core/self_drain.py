"""A process draining itself: the drain request a signal stands for, begun or followed.

Both ways a signal turns into a drain use this: ``forgezero-lifecycle serve``
(:mod:`forgezero_lifecycle.serve.server`) and the signal hook a runtime installs under a server
the user runs (:mod:`forgezero_lifecycle.core.signal_drain`). The request is the one an
orchestrator would send: protocol ``forgezero-drain/v1``, a fresh nonce, ``sourceRevision`` the
runtime's own revision (40 zeros when it does not know it) and ``timeoutMs`` within the
protocol's bounds. If a drain is already active (an orchestrator began one), it is followed
instead, for at most the same deadline: one process, one drain.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Final

from .._errors import LifecycleError
from ..wire._protocol import DRAIN_PROTOCOL, DrainState, deadline_ms
from .drain import DrainController

__all__ = ["UNKNOWN_REVISION", "self_drain", "self_drain_request"]

#: sourceRevision (and targetRevision) of a self-drain when the revision is not known.
UNKNOWN_REVISION: Final = "0" * 40


def self_drain_request(revision: str | None, timeout: float) -> dict[str, object]:
    """The wire request of a self-drain with a deadline of ``timeout`` seconds (clamped)."""
    timeout_ms = deadline_ms(timeout)
    return {
        "protocol": DRAIN_PROTOCOL,
        "nonce": secrets.token_urlsafe(32),
        "sourceRevision": revision or UNKNOWN_REVISION,
        "targetRevision": UNKNOWN_REVISION,
        "timeoutMs": timeout_ms,
    }


async def self_drain(
    drain: DrainController,
    *,
    revision: str | None,
    timeout: float,
    log: logging.Logger,
    events: str,
) -> DrainState:
    """Begin a self-drain (or follow the active one) and wait until it settles.

    Returns the state it reached. A drain begun by someone else is waited for at most
    ``timeout`` seconds too (``failed`` after that), so a signal's stop keeps its one deadline;
    a request the controller refuses counts as ``failed``. The caller's logger records
    ``<events>.following_drain``, ``<events>.follow_timeout`` and ``<events>.drain_refused``.
    """
    try:
        if not drain.active:
            drain.begin(self_drain_request(revision, timeout), origin="signal")
            return await drain.wait()
        log.info(
            "%s.following_drain: a drain was already begun; waiting for it at most %.1f s",
            events,
            timeout,
        )
        try:
            return await asyncio.wait_for(drain.wait(), timeout)
        except TimeoutError:
            log.error("%s.follow_timeout: the drain had not settled within %.1f s", events, timeout)
            return "failed"
    except LifecycleError as error:
        log.error("%s.drain_refused code=%s", events, error.code)
        return "failed"
