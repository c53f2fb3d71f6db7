"""One OpenTelemetry span per gateway request, following the GenAI semantic conventions, plus `prefixscope.*`.

The span starts when the request arrives, as a child of the client's span when a W3C `traceparent` header came
with it, and its context goes to the upstream in the same header, so the application's span, the gateway's and the
engine's form one trace. It ends when the request's record is built (`RequestTracker.finish`), with attributes read
from that record, so a span and its database row say the same thing. Ending only queues the span with the record:
the attributes are built from it, and the span exported, on the batch processor's thread (`prefixscope.tracing`), so
the request path pays for neither. A span that is not recording (its parent was not sampled) gets no attributes.

No prompt text goes into a span unless the tenant's settings store it in the records too (`store_prompt_text`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import httpx
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from db.records import RequestRecord
from gateway.asgi_io import header_values
from gateway.telemetry import genai
from gateway.telemetry.response_facts import ResponseFacts
from prefixscope.tracing import HEADER_GETTER, PROPAGATOR, Tracing

_TRACEPARENT = b"traceparent"
_TRACESTATE = b"tracestate"
# A request without `traceparent` starts a trace of its own: an empty context says so directly, where None would have
# the SDK look up the current context (three context-variable reads per span).
_NO_PARENT = Context()


class RequestSpan:
    """The live span of one request."""

    __slots__ = ("_span", "_spans", "response", "_upstream_headers")

    def __init__(self, span: trace.Span, spans: RequestSpans) -> None:
        self._span = span
        self._spans = spans
        self.response = ResponseFacts()
        self._upstream_headers: list[tuple[str, str]] | None = None

    def upstream_headers(self) -> list[tuple[str, str]]:
        """`traceparent` (and `tracestate`) naming this span as the parent of the upstream's, in W3C Trace Context's
        version 00 format: what `TraceContextTextMapPropagator.inject` writes, formatted here directly because it
        runs on the request path (a few microseconds less than a context and a carrier per request)."""
        if self._upstream_headers is None:
            context = self._span.get_span_context()
            headers = [("traceparent", f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}")]
            if context.trace_state:
                headers.append(("tracestate", context.trace_state.to_header()))
            self._upstream_headers = headers
        return self._upstream_headers

    def end(self, record: RequestRecord) -> None:
        """End the span (queued for export) with its name, status and attributes from the finished request's
        record; the attributes are built on the export thread."""
        span = self._span
        if span.is_recording():
            if record.model:
                span.update_name(f"{genai.operation_name(record.endpoint)} {record.model}")
            if record.status_code >= 500:  # as HTTP server spans do: a 4xx is the client's error, not the server's
                span.set_status(Status(StatusCode.ERROR, record.error_type or str(record.status_code)))
            provider, response = self._spans.provider_for(record.upstream), ResponseFacts()
            self.response.copy_to(response)  # as it stands now: the export thread reads it later
            self._spans.tracing.defer_attributes(
                span.get_span_context().span_id, lambda: genai.record_attributes(record, provider, response)
            )
        span.end()


class RequestSpans:
    """Starts request spans for one gateway; `upstream_kinds` maps upstream names to their kind (the provider)."""

    def __init__(self, tracing: Tracing, upstream_kinds: Mapping[str, str]) -> None:
        self.tracing = tracing
        self._tracer = tracing.tracer
        self._providers = {name: genai.provider_name(kind) for name, kind in upstream_kinds.items()}

    def provider_for(self, upstream: str) -> str | None:
        return self._providers.get(upstream)

    def start(self, scope: dict[str, Any], endpoint: str, start_time_ns: int | None = None) -> RequestSpan:
        """A span for the request in `scope`, started now (or at `start_time_ns`), under the incoming trace if any."""
        incoming = header_values(scope, _TRACEPARENT, _TRACESTATE)
        parent = _NO_PARENT
        if _TRACEPARENT in incoming:
            carrier = {"traceparent": incoming[_TRACEPARENT]}
            if _TRACESTATE in incoming:
                carrier["tracestate"] = incoming[_TRACESTATE]
            parent = PROPAGATOR.extract(carrier, getter=HEADER_GETTER)
        span = self._tracer.start_span(
            genai.operation_name(endpoint),
            context=parent,
            kind=SpanKind.SERVER,
            start_time=start_time_ns if start_time_ns is not None else time.time_ns(),
        )
        return RequestSpan(span, self)


def with_trace_context(request: httpx.Request, span: RequestSpan | None) -> httpx.Request:
    """`request` carrying the span's `traceparent` to the upstream (unchanged when the request is not traced)."""
    if span is not None:
        headers = request.headers
        for name, value in span.upstream_headers():
            headers[name] = value  # one item at a time: several times cheaper than `Headers.update`
    return request
