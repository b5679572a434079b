"""``python -m forgezero_lifecycle``: the same command line as ``forgezero-lifecycle``."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
