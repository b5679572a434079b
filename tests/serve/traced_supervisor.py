"""``python -m tests.serve.traced_supervisor serve …``: the command line with OpenTelemetry's SDK
set up in the supervisor's process, as ``opentelemetry-instrument`` would: every span it ends is
written as one JSON line to the file ``FZW_SPANS`` names (name, ids, parent, attributes, events).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from forgezero_lifecycle.cli.main import main


class _JsonLines(SpanExporter):
    def __init__(self, path: str) -> None:
        self._path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self._path, "a", encoding="utf-8") as out:
            for span in spans:
                record = {
                    "name": span.name,
                    "span_id": span.context.span_id if span.context else None,
                    "parent_id": span.parent.span_id if span.parent else None,
                    "status": span.status.status_code.name,
                    "attributes": dict(span.attributes or {}),
                    "events": [event.name for event in span.events],
                }
                out.write(json.dumps(record) + "\n")
        return SpanExportResult.SUCCESS


_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(_JsonLines(os.environ["FZW_SPANS"])))
trace.set_tracer_provider(_provider)

if __name__ == "__main__":
    raise SystemExit(main())
