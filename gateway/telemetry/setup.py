"""Starting the gateway's request spans from its config: the tracer, its export, and the export's metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.config import GatewayConfig
from gateway.telemetry.request_span import RequestSpans
from prefixscope.tracing import ExportMetrics, Tracing

METRICS_PREFIX = "prefixscope_gateway"


def start_request_spans(config: GatewayConfig, registry: CollectorRegistry) -> RequestSpans | None:
    """Request spans exported where `config.telemetry` says, with `prefixscope_gateway_trace_spans{outcome}` and
    `prefixscope_gateway_trace_spans_queued` in `registry`; None when tracing is off. The export thread starts here;
    nothing is sent before the first span ends."""
    export = config.telemetry.trace_export()
    if export is None:
        return None
    tracing = Tracing(export)
    registry.register(ExportMetrics(METRICS_PREFIX, tracing))
    return RequestSpans(tracing, {upstream.name: upstream.kind for upstream in config.upstreams})
