"""`prefixscope.otlp_encoding` writes the very bytes the OpenTelemetry SDK's encoder writes, or declines; the
export thread adds each span's deferred attributes, and a full queue's drops are counted."""

from __future__ import annotations

import threading

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from otlp_receiver import otlp_receiver

from prefixscope.export_failures import ExportFailureLog
from prefixscope.otlp_encoding import encode_request
from prefixscope.tracing import (
    ExportCounts,
    TraceExport,
    Tracing,
    _CountingBatchProcessor,
    _CountingExporter,
    traces_url,
    with_attributes,
)

REMOTE_PARENT = TraceContextTextMapPropagator().extract(
    {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "vendor=a,other=b"}
)
ATTRIBUTES = {
    "text": "caf\u00e9 \u2603", "empty": "", "yes": True, "no": False, "zero": 0, "negative": -7, "large": 2**63 - 1,
    "smallest": -(2**63), "ratio": 0.25, "raw": b"\x00\xff", "names": ("a", ""), "counts": (1, -2), "flags": (True,),
    "ratios": (1.5,), "nothing": (),
}


def _spans(provider: TracerProvider, scope: str, version: str | None = None) -> list:
    tracer = provider.get_tracer(scope, version, schema_url="https://opentelemetry.io/schemas/1.21.0" if version else None)
    spans = []
    for index, kind in enumerate(SpanKind):
        parent = REMOTE_PARENT if index % 2 else None
        span = tracer.start_span(f"op {index}" if index else "", context=parent, kind=kind, attributes=ATTRIBUTES)
        if index == 1:
            span.set_status(Status(StatusCode.ERROR, "upstream failed"))
        elif index == 2:
            span.set_status(Status(StatusCode.OK))
        span.end()
        spans.append(span)
    child = tracer.start_span("child", context=set_span_in_context(spans[0]))
    child.end()
    return [*spans, child]


def test_the_bytes_equal_the_sdk_encoders_for_every_kind_status_parent_and_value_type():
    first = TracerProvider(resource=Resource.create({"service.name": "gateway", "replicas": 2}))
    second = TracerProvider(resource=Resource({"service.name": "engine"}, schema_url="https://example.com/schema"))
    spans = [*_spans(first, "prefixscope"), *_spans(first, "other", "1.2"), *_spans(second, "prefixscope")]
    extra = [{"text": "replaced", "added": 3} if index % 3 == 0 else None for index in range(len(spans))]
    with_extra = [span if more is None else with_attributes(span, more) for span, more in zip(spans, extra)]
    assert encode_request(spans, extra) == encode_spans(with_extra).SerializePartialToString()
    assert encode_request(spans) == encode_spans(spans).SerializePartialToString()
    assert encode_request([]) == encode_spans([]).SerializePartialToString() == b""


def test_spans_it_does_not_write_are_declined():
    tracer = TracerProvider().get_tracer("prefixscope")
    with_event = tracer.start_span("with an event")
    with_event.add_event("retry")
    with_event.end()
    plain = tracer.start_span("plain")
    plain.end()
    assert encode_request([plain, with_event]) is None
    assert encode_request([plain], [{"too large": 2**63}]) is None
    assert encode_request([plain], [{"a set": {1}}]) is None
    assert encode_request([plain], [{"fine": 1}]) is not None


def test_a_declined_batch_is_still_exported_with_its_deferred_attributes():
    with otlp_receiver() as receiver:
        tracing = Tracing(TraceExport(traces_url=traces_url(receiver.url), service_name="encoding-test"))
        try:
            for name in ("plain", "with an event"):
                span = tracing.tracer.start_span(name)
                if name != "plain":
                    span.add_event("retry")
                tracing.defer_attributes(span.get_span_context().span_id, lambda name=name: {"built.for": name})
                span.end()
            tracing.force_flush()
            received = receiver.wait_for(lambda spans: len(spans) == 2)
        finally:
            tracing.shutdown()
    assert {span.name: span.attributes["built.for"] for span in received} == {
        "plain": "plain", "with an event": "with an event"
    }
    assert tracing.counts.exported == 2 and tracing.counts.failed == 0


class _HeldExporter(SpanExporter):
    """Takes batches into a list; the first export waits until `release` is set, holding the export thread."""

    def __init__(self) -> None:
        self.spans: list = []
        self.exporting = threading.Event()
        self.release = threading.Event()

    def export(self, spans):  # type: ignore[no-untyped-def]
        self.exporting.set()
        self.release.wait(10)
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def test_a_full_queue_counts_the_span_it_pushes_out_and_the_rest_keep_their_attributes():
    export = TraceExport(traces_url="http://127.0.0.1:9/v1/traces", service_name="queue-test", max_queue_size=3,
                         max_export_batch_size=1, schedule_delay_ms=60_000)
    counts, deferred, inner = ExportCounts(), {}, _HeldExporter()
    exporter = _CountingExporter(inner, counts, deferred, ExportFailureLog(export.traces_url))
    processor = _CountingBatchProcessor(exporter, counts, export, deferred)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("prefixscope")

    def end(name: str) -> None:
        span = tracer.start_span(name)
        deferred[span.get_span_context().span_id] = lambda: {"built.for": name}
        span.end()

    try:
        end("first")
        assert inner.exporting.wait(10)  # the export thread holds "first"; the queue fills behind it
        for name in ("second", "third", "fourth", "fifth"):
            end(name)
        assert counts.dropped == 1  # "fifth" pushed out "second", the oldest queued
        inner.release.set()
        provider.force_flush()
    finally:
        inner.release.set()
        provider.shutdown()
    assert {span.name: span.attributes["built.for"] for span in inner.spans} == {
        name: name for name in ("first", "third", "fourth", "fifth")
    }
    assert deferred == {} and counts.exported == 4
