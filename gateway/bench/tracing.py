"""What request spans add to the gateway's request path (`prefixscope bench gateway --tracing`).

Two figures, one target:

- end to end: a second gateway process, the same as the first but exporting a span per request over OTLP/HTTP (to the
  bench's stub, which takes `POST /v1/traces`), is paired with the first one: each pair sends one request through
  the gateway without spans and one through the gateway with them, back to back in alternating order, and the
  median of the per-pair differences (traced - untraced) must stay within `TRACING_TARGETS` (0.1 ms). Pairing the
  two gateways, rather than subtracting medians of two runs minutes apart, lets the machine's load fall on both;
- in process: the tracing work of one request, timed one request at a time, in microseconds: before the response
  (start the span under an incoming `traceparent`, put its context on the upstream request) and after it (read the
  response's id, model and finish reasons, name the span from the record and end it into the batch processor's
  queue; the gateway does this once the client has its whole response). Building the attributes from the record and
  the export itself run on the processor's thread.
"""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from db.records import RequestRecord
from gateway.telemetry.request_span import RequestSpans, with_trace_context
from prefixscope.tracing import TraceExport, Tracing, traces_url

TRACING_TARGETS = {"tracing_added_p50_ms_max": 0.1}


def telemetry_section(collector_url: str, key_snapshot: Path) -> str:
    """What the traced gateway's config adds: its `[telemetry]`, and a key snapshot of its own (two gateways writing
    the default one at once would race)."""
    return f'\n[auth]\nsnapshot_path = "{key_snapshot}"\n\n[telemetry]\notlp_endpoint = "{collector_url}"\n'


def _record(request_id: str) -> RequestRecord:
    return RequestRecord(
        request_id=request_id, created_at=datetime.now(UTC), tenant="default", key_id=None,
        endpoint="chat.completions", model="bench", upstream="local", stream=False, status_code=200,
        error_type=None, prompt_tokens=512, cached_tokens=448, completion_tokens=8, ttft_ms=1.5, latency_ms=2.5,
        applied_rules=("tool_schema_key_order", "tool_order"), miss_kind="partial", miss_reason="messages_changed",
        recomputed_tokens=64, divergence_segment="messages[1]", divergence_char_offset=0, divergence_source="engine",
        replica="http://127.0.0.1:8001", routing_policy="cache_aware", predicted_match_tokens=448,
    )


def measure_request_path(collector_url: str, num_requests: int = 5000) -> dict[str, Any]:
    """Per-request microseconds (p50, p99) of the tracing work on the request path, exporting to `collector_url`."""
    tracing = Tracing(TraceExport(traces_url=traces_url(collector_url), service_name="prefixscope-bench"))
    spans = RequestSpans(tracing, {"local": "local_engine"})
    scope = {"headers": [(b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")]}
    upstream = httpx.Request("POST", "http://127.0.0.1:8001/v1/chat/completions", content=b"{}")
    records = [_record(f"req_{i}") for i in range(num_requests)]
    before: list[float] = []
    after: list[float] = []
    try:
        for record in records:
            started = time.perf_counter()
            span = spans.start(scope, "chat.completions")
            with_trace_context(upstream, span)
            answered = time.perf_counter()
            span.response.read_body("chatcmpl-bench", "bench", [{"finish_reason": "stop"}])
            span.end(record)
            before.append((answered - started) * 1e6)
            after.append((time.perf_counter() - answered) * 1e6)
            if len(before) % 500 == 0:
                time.sleep(0.01)  # let the export thread keep up, as it does between requests
        tracing.force_flush()
    finally:
        tracing.shutdown()
    counts = tracing.counts
    return {
        "requests": num_requests,
        "before_response_us": _quantiles_us(before),
        "after_response_us": _quantiles_us(after),
        "spans_exported": counts.exported,
        "spans_failed": counts.failed,
        "spans_dropped": counts.dropped,
    }


def _quantiles_us(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": round(statistics.median(ordered), 1), "p99": round(ordered[int(len(ordered) * 0.99) - 1], 1)}


def tracing_report(
    paired: dict[str, Any], request_path: dict[str, Any], gateway_counts: dict[str, float]
) -> dict[str, Any]:
    """The `tracing` section of the bench report: the pairs (traced gateway against untraced gateway; the median of
    their differences is the target's measured value), the in-process figures and the traced gateway's export
    outcomes."""
    return {
        "paired_traced_vs_untraced": paired,
        "tracing_added_p50_ms": paired["added_latency_ms"]["p50"],
        "request_path": request_path,
        "gateway_spans": gateway_counts,
    }


def span_counts(metrics_text: str) -> dict[str, float]:
    """`prefixscope_gateway_trace_spans_total` by outcome, from a `/metrics` scrape."""
    counts = {}
    for line in metrics_text.splitlines():
        if line.startswith("prefixscope_gateway_trace_spans_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            counts[outcome] = float(line.rsplit(" ", 1)[1])
    return counts
