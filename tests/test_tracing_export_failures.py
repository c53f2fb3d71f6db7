"""A collector that cannot be reached is logged once when span exports start failing and once when they recover,
with no record per failed export; every failed span stays counted for `/metrics`. Real OTLP/HTTP exports to a
local port: first nothing listens there, then a minimal collector does."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from prefixscope.tracing import TraceExport, Tracing


class _Collector(BaseHTTPRequestHandler):
    """Takes every `POST /v1/traces` (an empty ExportTraceServiceResponse: all spans accepted)."""

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        pass


@contextmanager
def collector_on(port: int) -> Iterator[None]:
    server = ThreadingHTTPServer(("127.0.0.1", port), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def end_span_and_flush(tracing: Tracing) -> None:
    with tracing.tracer.start_as_current_span("request"):
        pass
    tracing.force_flush(timeout_s=10)


def test_an_unreachable_collector_is_one_warning_then_one_recovery_line(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    tracing = Tracing(TraceExport(traces_url=f"http://127.0.0.1:{port}/v1/traces", service_name="test",
                                  export_timeout_s=0.5, schedule_delay_ms=60_000))
    caplog.set_level(logging.DEBUG)
    try:
        for _ in range(3):
            end_span_and_flush(tracing)
        assert (tracing.counts.failed, tracing.counts.failed_exports) == (3, 3)
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert warnings[0].name == "prefixscope.export_failures" and not warnings[0].exc_info
        assert f"span export to http://127.0.0.1:{port}/v1/traces is failing (" in warnings[0].getMessage()
        assert not [r for r in caplog.records if r.name.startswith("opentelemetry") and r.levelno >= logging.INFO]

        caplog.clear()
        with collector_on(port):
            end_span_and_flush(tracing)
            end_span_and_flush(tracing)
        assert (tracing.counts.exported, tracing.counts.failed) == (2, 3)
        (recovered,) = [r for r in caplog.records if r.name == "prefixscope.export_failures"]
        assert recovered.levelno == logging.INFO
        assert recovered.getMessage() == (
            f"span export to http://127.0.0.1:{port}/v1/traces recovered after 3 failed exports (3 spans not exported)"
        )

        caplog.clear()
        end_span_and_flush(tracing)  # the collector went away again: one more warning
        assert [r.levelname for r in caplog.records if r.levelno >= logging.INFO] == ["WARNING"]
    finally:
        tracing.shutdown()
