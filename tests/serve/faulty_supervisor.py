"""``python -m tests.serve.faulty_supervisor serve …``: the command line with one fault injected
into the supervisor's own code, named by ``FZW_FAULT`` (a bug in the supervisor cannot be made
to happen from outside; everything else, the workers and their sockets, is real)::

    accept      the action that lets a new generation (2 and later) accept raises
    schedules   the supervisor's answer to a forwarded ``schedules/v1/status`` call raises
"""

from __future__ import annotations

import os
from typing import Any

from forgezero_lifecycle.cli.main import main
from forgezero_lifecycle.serve.supervisor import ForwardedControl, Supervisor
from forgezero_lifecycle.serve.workers import Generation


class InjectedFaultError(Exception):
    """What the injected fault raises."""


_FAULT = os.environ["FZW_FAULT"]
_accept = Supervisor._accept


async def _failing_accept(
    self: Supervisor, generation: Generation, indexes: tuple[int, ...], *, whole: bool
) -> None:
    if generation.number > 1:
        raise InjectedFaultError("the new generation's accept failed")
    await _accept(self, generation, indexes, whole=whole)


async def _failing_schedules(self: ForwardedControl, arguments: Any) -> Any:
    raise InjectedFaultError("the schedules answer failed")


if _FAULT == "accept":
    Supervisor._accept = _failing_accept  # type: ignore[method-assign]
elif _FAULT == "schedules":
    ForwardedControl._schedules = _failing_schedules  # type: ignore[method-assign]
else:
    raise SystemExit(f"unknown FZW_FAULT {_FAULT!r}")

if __name__ == "__main__":
    raise SystemExit(main())
