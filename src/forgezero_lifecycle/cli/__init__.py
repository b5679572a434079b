"""``forgezero-lifecycle``: drive a generation's drain and handoff, serve an app, run the demo.

Tokens come from ``FORGEZERO_CONTROL_TOKEN`` and ``FORGEZERO_HANDOFF_TOKEN`` (or a file named by
``--token-file`` / ``--handoff-token-file``), never from a flag that ``ps`` would show. Errors
are one line on stderr; progress goes to stderr, results (and ``--json``) to stdout.

Modules: ``main`` (the parser, the entry point, errors as exit codes), ``commands`` (the
commands that talk to a control plane), ``output`` (what they print, and the exit code a final
status means).
"""

from .main import main as main
from .output import EXIT_FAILED as EXIT_FAILED
from .output import EXIT_GAVE_UP as EXIT_GAVE_UP
from .output import EXIT_OK as EXIT_OK
from .output import EXIT_UNREACHABLE as EXIT_UNREACHABLE
from .output import EXIT_USAGE as EXIT_USAGE

__all__ = ["EXIT_FAILED", "EXIT_GAVE_UP", "EXIT_OK", "EXIT_UNREACHABLE", "EXIT_USAGE", "main"]
