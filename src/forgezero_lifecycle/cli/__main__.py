"""``python -m forgezero_lifecycle.cli``: the same command line as ``forgezero-lifecycle``."""

from __future__ import annotations

from .main import main

raise SystemExit(main())
