"""The orchestrator's side of the control protocol: an httpx client for every control endpoint.

::

    async with ControlClient("http://127.0.0.1:8000", token=control_token) as client:
        request = drain_request(source_revision=OLD, target_revision=NEW, timeout_ms=30_000)
        await client.begin_drain(request)
        status = await client.wait_drained(request.nonce, on_progress=print)

Answers are the wire models (:class:`DrainStatus`, :class:`StateHandoffStatus`, ...). An error
body ``{"error": CODE}`` becomes the library's typed error for that code
(:func:`~forgezero_lifecycle._errors.error_for_code`); a server that cannot be reached raises
:class:`~forgezero_lifecycle._errors.ControlUnreachableError`.

Retries: every control call is safe to repeat (reads; ``begin`` with the same request is
acknowledged as a duplicate by design; a rollback of the same nonce returns the same status), so
transport failures and gateway answers (502/503/504 without a control-plane error body) are
retried with a short backoff. An answer of the control plane itself is never retried.

Tokens travel only in the ``Authorization`` header (and, for a handoff, in the request body the
new generation needs); they are never logged and never part of an error message. Proxy settings
from the environment are ignored: the control plane is reached directly.
"""

from ._client import ControlClient as ControlClient
from ._client import drain_request as drain_request
from ._client import handoff_request as handoff_request
from ._client import new_nonce as new_nonce
from ._sync import SyncControlClient as SyncControlClient

__all__ = [
    "ControlClient",
    "SyncControlClient",
    "drain_request",
    "handoff_request",
    "new_nonce",
]
