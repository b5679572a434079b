"""The README's ``JobWorker`` reference names every constructor option with its real default."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from forgezero_lifecycle.jobs import JobWorker

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_the_readme_reference_lists_every_job_worker_option_with_its_default() -> None:
    """A new option, or a changed default, must show in the reference block too."""
    start = README.index("#### `JobWorker` reference")
    block = README[start : README.index("```\n", README.index("```python", start) + 9)]
    written = dict(re.findall(r"^    (\w+)(?:=(\S+?))?,", block, re.MULTILINE))
    for name, parameter in inspect.signature(JobWorker).parameters.items():
        assert name in written, name
        default = parameter.default
        if default is inspect.Parameter.empty:
            assert written[name] == "", name
        else:
            shown = getattr(default, "__name__", repr(default))
            assert written[name] == shown, (name, written[name], shown)
