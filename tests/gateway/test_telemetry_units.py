"""Request spans and per-tenant counters without an engine: attribute names and values, settings, export outcomes."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import httpx
import pytest
from gateway_testkit import closed_port, gateway_config, running_gateway, wait_until
from otlp_receiver import otlp_receiver
from prometheus_client import CollectorRegistry

from db.records import RequestRecord
from gateway.config import parse_config
from gateway.errors import ConfigError
from gateway.telemetry import genai
from gateway.telemetry.response_facts import ResponseFacts
from gateway.config.telemetry import TelemetrySettings, with_environment
from gateway.telemetry.tenant_metrics import TenantMetrics
from prefixscope.tracing import export_from_env, parse_headers


def _record(**changes) -> RequestRecord:
    base = RequestRecord(
        request_id="req_1", created_at=datetime.now(UTC), tenant="acme", key_id="k1", endpoint="chat.completions",
        model="smollm2", upstream="local", stream=False, status_code=200, error_type=None, prompt_tokens=120,
        cached_tokens=96, completion_tokens=7, ttft_ms=12.5, latency_ms=40.0, miss_reason="system_changed",
        recomputed_tokens=24, divergence_segment="system", divergence_char_offset=31, divergence_source="engine",
    )
    return replace(base, **changes)


def test_span_attributes_follow_the_current_genai_names():
    """The GenAI attribute names are the current semantic conventions' (`gen_ai.provider.name`, not the older
    `gen_ai.system`; cached prompt tokens as `gen_ai.usage.cache_read.input_tokens`)."""
    facts = ResponseFacts()
    facts.read_body("chatcmpl-9", "smollm2-135m", [{"finish_reason": "length"}])
    attributes = genai.record_attributes(_record(), genai.provider_name("local_engine"), facts)
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "prefixscope"
    assert attributes["gen_ai.request.model"] == "smollm2"
    assert attributes["gen_ai.response.model"] == "smollm2-135m"
    assert attributes["gen_ai.response.id"] == "chatcmpl-9"
    assert attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert attributes["gen_ai.usage.input_tokens"] == 120
    assert attributes["gen_ai.usage.output_tokens"] == 7
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == 96
    assert attributes["prefixscope.miss_reason"] == "system_changed"
    assert attributes["prefixscope.divergence.segment"] == "system"
    assert attributes["prefixscope.divergence.char_offset"] == 31
    assert "gen_ai.system" not in attributes
    # Unknown values are left out, never sent as placeholders; no prompt text unless the record holds it.
    assert "gen_ai.usage.cache_write.input_tokens" not in attributes  # not a Messages API request
    messages = genai.record_attributes(_record(endpoint="messages", cache_write_tokens=64), "anthropic", facts)
    assert messages["gen_ai.usage.cache_write.input_tokens"] == 64  # the current name
    assert messages["gen_ai.usage.cache_creation.input_tokens"] == 64  # the name it renamed, which backends still read
    assert "error.type" not in attributes
    assert genai.PROMPT_TEXT not in attributes
    assert genai.record_attributes(_record(prompt_text="hello"), None, ResponseFacts())[genai.PROMPT_TEXT] == "hello"
    assert genai.record_attributes(_record(endpoint="completions"), None, facts)["gen_ai.operation.name"] == (
        "text_completion"
    )
    assert genai.provider_name("anthropic") == "anthropic" and genai.provider_name("openai") == "openai"


def test_span_attributes_carry_the_conversation_and_the_token_ledger():
    record = _record(conversation_id="cv_1", turn_index=3, parent_request_id="r2", answer_rewrite="whitespace",
                     new_tokens=14, unknown_tokens=0, lost_answer_rewritten_tokens=10, lost_page_alignment_tokens=0)
    attributes = genai.record_attributes(record, None, ResponseFacts())
    assert (attributes["prefixscope.conversation.id"], attributes["prefixscope.conversation.turn"]) == ("cv_1", 3)
    assert attributes["prefixscope.conversation.parent_request_id"] == "r2"
    assert attributes["prefixscope.conversation.answer_rewrite"] == "whitespace"
    assert (attributes["prefixscope.ledger.new_tokens"], attributes["prefixscope.ledger.unknown_tokens"]) == (14, 0)
    assert attributes["prefixscope.ledger.lost.answer_rewritten_tokens"] == 10
    assert "prefixscope.ledger.lost.page_alignment_tokens" not in attributes  # causes that cost nothing are left out


def test_finish_reasons_are_read_from_stream_events_without_decoding_them():
    facts = ResponseFacts()
    facts.scan_finish_reasons(b'data: {"choices":[{"delta":{"content":"\\"finish_reason\\": \\"no\\""},'
                              b'"finish_reason":null}]}\n\n')
    facts.scan_finish_reasons(b'data: {"choices":[{"delta":{},"finish_reason": "stop"}]}\n\n')
    assert facts.finish_reasons == ["stop"]


def test_telemetry_settings_and_the_standard_environment():
    assert parse_config({}).telemetry.trace_export() is None  # off unless asked for
    settings = parse_config({"telemetry": {"otlp_endpoint": "http://collector:4318", "headers": {"X-Key": "k"}}})
    export = settings.telemetry.trace_export()
    assert export.traces_url == "http://collector:4318/v1/traces"
    assert export.headers == {"x-key": "k"} and export.service_name == "prefixscope-gateway"
    with pytest.raises(ConfigError, match="otlp_endpoint"):
        parse_config({"telemetry": {"otlp_endpoint": "collector:4318"}})
    with pytest.raises(ConfigError, match=r"unknown \[telemetry\] keys"):
        parse_config({"telemetry": {"endpoint": "http://x"}})
    # The environment wins over the file, and OTEL_SDK_DISABLED turns tracing off whatever the file says.
    from_env = with_environment(settings.telemetry, {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318/", "OTEL_SERVICE_NAME": "edge",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20t0k,x-tenant=a",
    })
    assert from_env.trace_export().traces_url == "http://otel:4318/v1/traces"
    assert from_env.service_name == "edge"
    assert from_env.headers == {"x-key": "k", "authorization": "Bearer t0k", "x-tenant": "a"}
    assert with_environment(settings.telemetry, {"OTEL_SDK_DISABLED": "true"}).trace_export() is None
    assert export_from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/custom"}, "s").traces_url == (
        "http://t:1/custom"  # the signal's own URL is used as given
    )
    assert export_from_env({}, "s") is None
    with pytest.raises(ValueError):
        parse_headers("no-equals-sign")
    with pytest.raises(ConfigError):
        with_environment(
            TelemetrySettings(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_EXPORTER_OTLP_HEADERS": "bad"}
        )
    # The environment's timeout wins over the file's export_timeout_s; without one the file's stays.
    assert from_env.export_timeout_s == settings.telemetry.export_timeout_s
    timed = with_environment(settings.telemetry, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4318",
                                                  "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "1500"})
    assert timed.export_timeout_s == 1.5 and timed.trace_export().export_timeout_s == 1.5
    # Spans go out as OTLP/HTTP protobuf only: a gRPC (or JSON) protocol is refused rather than failing every export.
    assert export_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
                           "s").traces_url == "http://x/v1/traces"
    for protocol in ("grpc", "http/json"):
        with pytest.raises(ConfigError, match="4318"):
            with_environment(TelemetrySettings(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317",
                                                   "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": protocol})


def test_tenant_hit_counters_are_pairs_over_the_same_requests():
    registry = CollectorRegistry()
    metrics = TenantMetrics(registry)
    metrics.observe(_record(miss_reason="new_prefix", prompt_tokens=100, cached_tokens=0, recomputed_tokens=100,
                            new_tokens=100, unknown_tokens=0))
    metrics.observe(_record(miss_reason="hit", prompt_tokens=100, cached_tokens=80, recomputed_tokens=0,
                            new_tokens=20, unknown_tokens=0))
    metrics.observe(_record(prompt_tokens=50, cached_tokens=None, miss_reason=None, unknown_tokens=50))  # unknown
    metrics.observe(_record(miss_reason="hit", prompt_tokens=10, cached_tokens=9))  # no ledger: not eligible-counted
    value = registry.get_sample_value
    tenant = {"tenant": "acme"}
    assert value("prefixscope_gateway_tenant_prompt_tokens_total", tenant) == 210
    assert value("prefixscope_gateway_tenant_cached_tokens_total", tenant) == 89
    # The ledger's eligible tokens: what an earlier request had sent (prompt - new), never a new turn.
    assert value("prefixscope_gateway_tenant_eligible_prompt_tokens_total", tenant) == 80
    assert value("prefixscope_gateway_tenant_eligible_cached_tokens_total", tenant) == 80
    assert value("prefixscope_gateway_tenant_miss_reasons_total", {**tenant, "reason": "new_prefix"}) == 1
    assert value("prefixscope_gateway_tenant_recomputed_tokens_total", {**tenant, "reason": "new_prefix"}) == 100


def test_recomputed_tokens_count_every_uncached_prompt_token_hits_included():
    """`recomputed_tokens` (span attribute, per-tenant and gateway-wide counters) is prompt - cached for every
    request: a hit's new suffix was prefilled too, though its explained miss cost is 0."""
    from gateway.metrics import GatewayMetrics

    hit = _record(miss_reason="hit", prompt_tokens=277, cached_tokens=259, recomputed_tokens=0)
    assert genai.record_attributes(hit, None, ResponseFacts())["prefixscope.recomputed_tokens"] == 18
    unknown = _record(prompt_tokens=None, recomputed_tokens=5)
    assert genai.record_attributes(unknown, None, ResponseFacts())["prefixscope.recomputed_tokens"] == 5
    registry = CollectorRegistry()
    metrics = TenantMetrics(registry)
    metrics.observe(_record(miss_reason="new_prefix", prompt_tokens=276, cached_tokens=0, recomputed_tokens=276))
    metrics.observe(hit)
    value = registry.get_sample_value
    recomputed = sum(value("prefixscope_gateway_tenant_recomputed_tokens_total", {"tenant": "acme", "reason": r}) or 0
                     for r in ("hit", "new_prefix"))
    assert recomputed == 553 - 259
    gateway = GatewayMetrics()
    gateway.observe(hit)
    assert gateway.registry.get_sample_value("prefixscope_gateway_recomputed_tokens_total", {"reason": "hit"}) == 18


def _metric(text: str, line_start: str) -> float:
    return float(next(line for line in text.splitlines() if line.startswith(line_start)).rsplit(" ", 1)[1])


def test_an_unreachable_collector_costs_requests_nothing_and_is_counted(stub, stub_url):
    telemetry = TelemetrySettings(otlp_endpoint=f"http://127.0.0.1:{closed_port()}", export_timeout_s=0.5)
    with running_gateway(replace(gateway_config(stub_url), telemetry=telemetry)) as gateway:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        responses = [httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=10) for _ in range(5)]
        assert [r.status_code for r in responses] == [200] * 5
        failed = 'prefixscope_gateway_trace_spans_total{outcome="failed"}'
        assert wait_until(lambda: _metric(httpx.get(f"{gateway.url}/metrics").text, failed) == 5, timeout_s=20)
        text = httpx.get(f"{gateway.url}/metrics").text
        assert _metric(text, 'prefixscope_gateway_trace_spans_total{outcome="exported"}') == 0


def test_gateway_span_continues_the_incoming_trace_and_passes_it_upstream(stub, stub_url):
    with otlp_receiver() as receiver:
        telemetry = TelemetrySettings(otlp_endpoint=receiver.url)
        with running_gateway(replace(gateway_config(stub_url), telemetry=telemetry)) as gateway:
            traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers={"traceparent": traceparent})
            assert response.status_code == 200
            (span,) = receiver.wait_for(lambda spans: len(spans) == 1)
    assert span.trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert span.parent_span_id == "b7ad6b7169203331"
    assert span.kind == "server" and span.service_name == "prefixscope-gateway"
    sent = stub.state.request_headers[-1]
    assert sent["traceparent"] == f"00-{span.trace_id}-{span.span_id}-01"
    assert span.attributes["prefixscope.request_id"] == response.headers["x-request-id"]


def test_bench_times_the_tracing_work_and_exports_every_span():
    from gateway.bench.tracing import measure_request_path, span_counts

    with otlp_receiver() as receiver:
        figures = measure_request_path(receiver.url, num_requests=50)
        spans = receiver.wait_for(lambda spans: len(spans) == 50)
    assert figures["spans_exported"] == 50 and figures["spans_failed"] == figures["spans_dropped"] == 0
    assert figures["before_response_us"]["p50"] > 0 and figures["after_response_us"]["p50"] > 0
    assert {span.parent_span_id for span in spans} == {"b7ad6b7169203331"}  # under the incoming traceparent
    text = 'prefixscope_gateway_trace_spans_total{outcome="exported"} 7.0\nprefixscope_gateway_trace_spans_queued 0.0'
    assert span_counts(text) == {"exported": 7.0}
