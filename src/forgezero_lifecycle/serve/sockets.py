"""The stop of a listening socket, where ``serve`` has always offered it.

The helpers live in :mod:`forgezero_lifecycle.stop.sockets`, where the runtime's signal hook under
a server the user runs can use them too; this module keeps their old import path.
"""

from __future__ import annotations

from ..stop.sockets import ListeningSocket as ListeningSocket
from ..stop.sockets import accept_queue_length as accept_queue_length
from ..stop.sockets import refuse_new_connections as refuse_new_connections

__all__ = ["ListeningSocket", "accept_queue_length", "refuse_new_connections"]
