"""OpenTelemetry trace export shared by the gateway and the engine: where spans go, and what became of them.

Spans are exported over OTLP/HTTP (protobuf) by the SDK's `BatchSpanProcessor`: ending a span only appends it to a
bounded in-memory queue, and a background thread encodes and posts batches. A slow or unreachable collector therefore
costs the request path nothing; what it costs is counted here: spans exported, spans whose export failed (after the
exporter's own retries), and spans dropped because the queue was full. A collector that cannot be reached is logged
once when exports start failing and once when they recover (`prefixscope.export_failures`), not once per export. A program may also leave a span's attributes
to the export thread (`Tracing.defer_attributes`): the request path then only says how to build them, and the SDK's
per-attribute checks and locks run, with the building, in that thread. That thread writes each batch's protobuf
bytes itself (`prefixscope.otlp_encoding`, several times cheaper than the SDK's encoder) and posts them through the
exporter's own client.

Where spans go comes from the program's config or from the standard environment variables of the OpenTelemetry
specification (`export_from_env`): `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full URL) or
`OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL to which `/v1/traces` is added), `OTEL_EXPORTER_OTLP_HEADERS`
(or `..._TRACES_HEADERS`), `OTEL_EXPORTER_OTLP_TIMEOUT` (or `..._TRACES_TIMEOUT`, milliseconds), `OTEL_SERVICE_NAME`,
and `OTEL_SDK_DISABLED=true` / `OTEL_TRACES_EXPORTER=none` to turn tracing off.

A neutral module: it imports nothing from the programs. Each program builds its own `TracerProvider` (never the
process-global one), so several gateways or engines in one test process keep their spans apart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote, unquote

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagators.textmap import DefaultGetter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from prefixscope.export_failures import ExportFailureLog, held_back_exporter_logs
from prefixscope.otlp_encoding import encode_request

TRACES_PATH = "/v1/traces"
ENV_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
ENV_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
ENV_HEADERS = "OTEL_EXPORTER_OTLP_HEADERS"
ENV_TRACES_HEADERS = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
ENV_TIMEOUT = "OTEL_EXPORTER_OTLP_TIMEOUT"
ENV_TRACES_TIMEOUT = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"
ENV_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
ENV_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
EXPORT_PROTOCOL = "http/protobuf"  # the only OTLP transport prefixscope speaks
ENV_SERVICE_NAME = "OTEL_SERVICE_NAME"
ENV_SDK_DISABLED = "OTEL_SDK_DISABLED"
ENV_TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"

# W3C Trace Context (`traceparent`, `tracestate`), the propagation format every OpenTelemetry SDK speaks by default.
PROPAGATOR = TraceContextTextMapPropagator()
HEADER_GETTER = DefaultGetter()

log = logging.getLogger(__name__)
_REASON_CHARS = 600  # of the exporter's messages, in the warning that exports are failing


@dataclass(frozen=True)
class TraceExport:
    """Where and how one program exports its spans.

    `traces_url` is the collector's OTLP/HTTP traces URL (`http://host:4318/v1/traces`); `headers` are sent with
    each export (an API key for a hosted backend). The batch settings are the SDK's defaults; `export_timeout_s`
    bounds one export with its retries.
    """

    traces_url: str
    service_name: str
    headers: Mapping[str, str] = field(default_factory=dict)
    export_timeout_s: float = 5.0
    max_queue_size: int = 2048
    max_export_batch_size: int = 512
    schedule_delay_ms: int = 500


def traces_url(endpoint: str) -> str:
    """The traces URL for an OTLP/HTTP base endpoint (`http://collector:4318` -> `http://collector:4318/v1/traces`),
    as the specification defines `OTEL_EXPORTER_OTLP_ENDPOINT`; an endpoint already ending in `/v1/traces` is kept."""
    base = endpoint.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def parse_headers(text: str) -> dict[str, str]:
    """`key1=value1,key2=value2` (values URL-encoded), the format of `OTEL_EXPORTER_OTLP_HEADERS`.
    Raises ValueError on an entry without `=`."""
    headers = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"OTLP header {item.strip()!r} is not name=value")
        headers[unquote(name.strip()).lower()] = unquote(value.strip())
    return headers


def format_headers(headers: Mapping[str, str]) -> str:
    """`headers` in the format of `OTEL_EXPORTER_OTLP_HEADERS` (names and values URL-encoded), which
    `parse_headers` reads back unchanged."""
    return ",".join(f"{quote(name, safe='')}={quote(value, safe='')}" for name, value in headers.items())


def tracing_disabled(env: Mapping[str, str]) -> bool:
    """Whether the environment turns tracing off (`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`)."""
    return (env.get(ENV_SDK_DISABLED, "").strip().lower() == "true"
            or env.get(ENV_TRACES_EXPORTER, "").strip().lower() == "none")


def export_from_env(env: Mapping[str, str], default_service_name: str,
                    default_timeout_s: float | None = None) -> TraceExport | None:
    """The export the standard OpenTelemetry environment variables ask for, or None when they name no endpoint or
    turn tracing off. Raises ValueError on malformed headers, a timeout that is not a positive number of ms, or a
    protocol other than http/protobuf (`OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`: a gRPC collector port would only
    fail every export). Without a timeout variable the export keeps `default_timeout_s` (None: TraceExport's)."""
    if tracing_disabled(env):
        return None
    url = env.get(ENV_TRACES_ENDPOINT, "").strip()
    if not url:
        base = env.get(ENV_ENDPOINT, "").strip()
        if not base:
            return None
        url = traces_url(base)
    protocol = (env.get(ENV_TRACES_PROTOCOL) or env.get(ENV_PROTOCOL) or EXPORT_PROTOCOL).strip().lower()
    if protocol != EXPORT_PROTOCOL:
        raise ValueError(f"OTLP protocol {protocol!r} is not supported: spans are exported as {EXPORT_PROTOCOL} "
                         f"(point the endpoint at the collector's OTLP/HTTP port, 4318 by default)")
    headers = parse_headers(env.get(ENV_TRACES_HEADERS) or env.get(ENV_HEADERS) or "")
    service_name = env.get(ENV_SERVICE_NAME, "").strip() or default_service_name
    timeout_ms = (env.get(ENV_TRACES_TIMEOUT) or env.get(ENV_TIMEOUT) or "").strip()
    if not timeout_ms:
        export = TraceExport(traces_url=url, service_name=service_name, headers=headers)
        return export if default_timeout_s is None else replace(export, export_timeout_s=default_timeout_s)
    try:
        timeout_s = float(timeout_ms) / 1000
    except ValueError:
        timeout_s = 0.0
    if not timeout_s > 0:
        raise ValueError(f"OTLP export timeout {timeout_ms!r} is not a positive number of milliseconds")
    return TraceExport(traces_url=url, service_name=service_name, headers=headers, export_timeout_s=timeout_s)


class ExportCounts:
    """What became of the spans one program ended; read by its `/metrics`. Updated from the request path (ended,
    dropped) and from the export thread (exported, failed), each under the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ended = 0
        self.exported = 0
        self.failed = 0  # spans in batches the collector did not take, after the exporter's retries
        self.dropped = 0  # spans lost to a full export queue (the SDK then pushes out the oldest queued one)
        self.failed_exports = 0  # batches

    def add(self, name: str, value: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + value)


AttributeSource = Callable[[], Mapping[str, Any]]


def with_attributes(span: ReadableSpan, attributes: Mapping[str, Any]) -> ReadableSpan:
    """`span` with `attributes` added to its own (the values must already be valid attribute values)."""
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes={**span.attributes, **attributes},
        events=span.events,
        links=span.links,
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _post_encoded(exporter: SpanExporter, data: bytes) -> SpanExportResult | None:
    """Send an encoded `ExportTraceServiceRequest` through the OTLP exporter's own HTTP client (its retries, timeout,
    headers and compression), after the exporter's request size check; None where this SDK version's exporter has no
    such client (the caller then has the exporter encode the spans itself)."""
    client = getattr(exporter, "_client", None)
    send = getattr(client, "export", None)
    if not isinstance(exporter, OTLPSpanExporter) or not callable(send):
        return None
    if getattr(exporter, "_shutdown", False):
        return SpanExportResult.FAILURE
    limit = getattr(exporter, "_max_request_size", 0) or 0
    if 0 < limit < len(data):
        log.warning("span batch of %d bytes dropped: over the exporter's request size limit", len(data))
        return SpanExportResult.FAILURE
    return SpanExportResult.SUCCESS if getattr(send(data), "success", False) else SpanExportResult.FAILURE


class _CountingExporter(SpanExporter):
    """The OTLP exporter, counting what each batch export achieved and adding each span's deferred attributes.
    Batches are encoded by `prefixscope.otlp_encoding` (the SDK's encoder where that declines a batch)."""

    def __init__(
        self, inner: SpanExporter, counts: ExportCounts, deferred: dict[int, AttributeSource], failures: ExportFailureLog
    ) -> None:
        self._inner = inner
        self._counts = counts
        self._deferred = deferred
        self._failures = failures

    def _attributes(self, span: ReadableSpan) -> Mapping[str, Any] | None:
        """The span's deferred attributes, built now (None: none deferred, or they could not be built)."""
        source = self._deferred.pop(span.context.span_id, None) if span.context is not None else None
        if source is None:
            return None
        try:
            return source()
        except Exception:  # noqa: BLE001 - one span's attributes must not cost the batch
            log.warning("span attributes could not be built", exc_info=True)
            return None

    def _send(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        extra = [self._attributes(span) for span in spans]
        data = encode_request(spans, extra)
        result = None if data is None else _post_encoded(self._inner, data)
        if result is not None:
            return result
        completed = [span if attributes is None else with_attributes(span, attributes)
                     for span, attributes in zip(spans, extra, strict=True)]
        return self._inner.export(completed)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        error: Exception | None = None
        with held_back_exporter_logs() as exporter_said:
            try:
                result = self._send(spans)
            except Exception as exc:  # noqa: BLE001 - a broken export must not kill the export thread
                error, result = exc, SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self._counts.add("exported", len(spans))
            self._failures.succeeded()
        else:
            self._counts.add("failed", len(spans))
            self._counts.add("failed_exports")
            said = [message.rstrip(". ") for message in exporter_said]
            if error is not None:
                said.append(f"{type(error).__name__}: {error}")
            self._failures.failed(len(spans), "; ".join(said)[:_REASON_CHARS] or "the exporter gave no reason")
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _CountingBatchProcessor(BatchSpanProcessor):
    """The SDK's batch processor, counting ended spans and those the full queue turned away."""

    def __init__(
        self, exporter: SpanExporter, counts: ExportCounts, export: TraceExport, deferred: dict[int, AttributeSource]
    ) -> None:
        super().__init__(
            exporter,
            max_queue_size=export.max_queue_size,
            max_export_batch_size=export.max_export_batch_size,
            schedule_delay_millis=export.schedule_delay_ms,
            export_timeout_millis=export.export_timeout_s * 1000,
        )
        self._counts = counts
        self._max_queue_size = export.max_queue_size
        self._deferred = deferred

    def on_end(self, span: ReadableSpan) -> None:
        self._counts.add("ended")
        queue = _queue_of(self)
        if queue is not None and len(queue) >= self._max_queue_size:
            self._counts.add("dropped")
            # A full queue takes the new span and pushes out its oldest one (the SDK's deque is bounded): that one is
            # never exported, so nothing is built for it.
            try:
                dropped = queue[-1]
            except IndexError:  # the export thread emptied the queue meanwhile
                dropped = None
            if dropped is not None and dropped.context is not None:
                self._deferred.pop(dropped.context.span_id, None)
        super().on_end(span)


def _queue_of(processor: BatchSpanProcessor) -> Any:
    """A batch processor's queue (newest on the left, exported from the right), None where this SDK version does not
    say."""
    batch = getattr(processor, "_batch_processor", None)
    return getattr(batch, "_queue", None)


def queue_length(processor: BatchSpanProcessor) -> int:
    """Spans waiting in a batch processor's queue (0 where this SDK version does not say)."""
    queue = _queue_of(processor)
    return len(queue) if queue is not None else 0


class Tracing:
    """One program's tracer and its export. `shutdown` exports what is queued (bounded by the export timeout)."""

    def __init__(self, export: TraceExport) -> None:
        self.export = export
        self.counts = ExportCounts()
        self.provider = TracerProvider(resource=Resource.create({SERVICE_NAME: export.service_name}))
        exporter = OTLPSpanExporter(
            endpoint=export.traces_url, headers=dict(export.headers), timeout=export.export_timeout_s
        )
        # span id -> how to build the rest of its attributes (set on the request path, taken by the export thread;
        # single dict operations, atomic under the interpreter lock)
        self._deferred: dict[int, AttributeSource] = {}
        self.failures = ExportFailureLog(export.traces_url)
        self._processor = _CountingBatchProcessor(
            _CountingExporter(exporter, self.counts, self._deferred, self.failures), self.counts, export, self._deferred
        )
        self.provider.add_span_processor(self._processor)
        self.tracer: Tracer = self.provider.get_tracer("prefixscope")

    @property
    def queued(self) -> int:
        return queue_length(self._processor)

    def defer_attributes(self, span_id: int, source: AttributeSource) -> None:
        """Have the export thread add `source()` to the attributes of the span `span_id` (a recording span of this
        tracer, called before it ends). The values must be valid attribute values (str, bool, int, float, or tuples
        of one of them); they are not checked again."""
        self._deferred[span_id] = source

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self.provider.shutdown()


class ExportMetrics(Collector):
    """`<prefix>_trace_spans{outcome}` (counter: `exported`, `failed`, `dropped`) and `<prefix>_trace_spans_queued`
    (gauge), read from a `Tracing` at scrape time."""

    def __init__(self, prefix: str, tracing: Tracing) -> None:
        self._prefix = prefix
        self._tracing = tracing

    def collect(self) -> Iterator[Metric]:
        counts = self._tracing.counts
        spans = CounterMetricFamily(
            f"{self._prefix}_trace_spans",
            "Spans ended, by what became of them: exported, failed (the collector did not take them after retries) "
            "or dropped (the export queue was full).",
            labels=["outcome"],
        )
        for outcome in ("exported", "failed", "dropped"):
            spans.add_metric([outcome], getattr(counts, outcome))
        yield spans
        yield GaugeMetricFamily(
            f"{self._prefix}_trace_spans_queued", "Spans waiting in the export queue.", value=self._tracing.queued
        )
