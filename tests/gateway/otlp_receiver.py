"""An OTLP/HTTP trace receiver for tests: what a collector's `otlp` receiver does for `POST /v1/traces`.

No OpenTelemetry Collector is packaged for Debian, PyPI or npm (it is a Go program), so the tests start this instead.
Requests are decoded with `opentelemetry-proto`, the Python build of the protocol's published `.proto` definitions
(`ExportTraceServiceRequest`), not with the SDK's own encoder, and answered with an `ExportTraceServiceResponse` as
the specification asks, so the exporter is exercised over its real protocol.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

SPAN_KINDS = {ProtoSpan.SPAN_KIND_SERVER: "server", ProtoSpan.SPAN_KIND_CLIENT: "client",
              ProtoSpan.SPAN_KIND_INTERNAL: "internal"}


@dataclass
class ReceivedSpan:
    service_name: str
    name: str
    kind: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root span
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int


@dataclass
class Receiver:
    url: str  # the base endpoint, as OTEL_EXPORTER_OTLP_ENDPOINT takes it
    spans: list[ReceivedSpan] = field(default_factory=list)
    content_types: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, spans: list[ReceivedSpan], content_type: str) -> None:
        with self._lock:
            self.spans.extend(spans)
            self.content_types.add(content_type)

    def wait_for(self, predicate: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 20.0) -> list[ReceivedSpan]:
        """The spans received so far once `predicate` holds for them (bounded wait; raises AssertionError)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"the receiver did not get the expected spans; got {[s.name for s in spans]}")
            time.sleep(0.05)

    def in_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [span for span in self.spans if span.trace_id == trace_id]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(item) for item in value.array_value.values)
    return getattr(value, kind) if kind else None


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(ReceivedSpan(
                    service_name=str(resource.get("service.name")),
                    name=span.name,
                    kind=SPAN_KINDS.get(span.kind, str(span.kind)),
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex(),
                    start_ns=span.start_time_unix_nano,
                    end_ns=span.end_time_unix_nano,
                    attributes={kv.key: _value(kv.value) for kv in span.attributes},
                    status_code=span.status.code,
                ))
    return spans


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """A receiver on a free port of 127.0.0.1, for the length of the block."""
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the standard library's name
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            receiver.add(decode(body), self.headers.get("content-type", ""))
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
