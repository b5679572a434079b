"""The stop of each connection, where ``serve`` has always offered it.

The classes live in :mod:`forgezero_lifecycle.stop.server`, where the runtime's signal hook
under a server the user runs can use them too; this module keeps their old import path.
"""

from __future__ import annotations

from ..stop.server import LINGER_TIMEOUT as LINGER_TIMEOUT
from ..stop.server import ConnectionStop as ConnectionStop
from ..stop.server import zero_loss_protocol as zero_loss_protocol

__all__ = ["LINGER_TIMEOUT", "ConnectionStop", "zero_loss_protocol"]
