"""Traces and metrics where operators look: the real engine and the gateway export spans over OTLP/HTTP to a receiver
the test starts (`otlp_receiver`), and both `/metrics` serve every series the shipped Grafana board and Prometheus
rules query.

One engine process (SmolLM2, small pool) and one gateway (SQLite records) serve the whole module.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from gateway_testkit import db_storage, gateway_config, running_gateway
from otlp_receiver import Receiver, ReceivedSpan, otlp_receiver
from real_engine_kit import create_keys, running_engine, stored

from gateway.config import TenantSettings, UpstreamConfig
from gateway.telemetry import genai
from gateway.config.telemetry import TelemetrySettings

pytestmark = pytest.mark.real_model

SYSTEM = "You are the support assistant of a bicycle shop. Answer in one short sentence. " * 6
SECRET_WORDS = "my locker code is 4711"


@dataclass
class Stack:
    receiver: Receiver
    engine_url: str
    gateway_url: str
    database_url: str
    keys: dict[str, str]

    def client(self, tenant: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.gateway_url}/v1", api_key=self.keys[tenant], max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp_path: Path = tmp_path_factory.mktemp("telemetry")
    database_url = f"sqlite:///{tmp_path}/gateway.db"
    keys = create_keys(database_url, ["quiet", "open"])
    with otlp_receiver() as receiver, running_engine(
        "--kv-cache-tokens", "4096", "--otlp-endpoint", receiver.url
    ) as engine_url:
        config = gateway_config(
            engine_url,
            # A replica set (of one engine), so the per-replica series are served too.
            upstreams=(
                UpstreamConfig(
                    name="engine", url=engine_url, kind="local_engine", timeout_s=300.0, replicas=(engine_url,),
                    routing="cache_aware",
                ),
            ),
            default_upstream="engine",
            auth="keys",
            # `open` lets its prompts be stored, so its spans may carry prompt text; `quiet` (the default) does not.
            tenants={"open": TenantSettings(store_prompt_text=True, uplift_sample_rate=0.0, advice_sample_rate=0.0)},
            telemetry=TelemetrySettings(otlp_endpoint=receiver.url),
        )
        with running_gateway(config, db_storage(database_url, tmp_path)) as gateway:
            yield Stack(receiver, engine_url, gateway.url, database_url, keys)


def _traceparent() -> tuple[str, str, str]:
    """An application's span context: (traceparent header, trace id, span id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _messages(user: str) -> list[dict]:
    return [{"role": "system", "content": f"[{uuid.uuid4().hex[:8]}] {SYSTEM}"}, {"role": "user", "content": user}]


def _one(spans: list[ReceivedSpan], **match: str) -> ReceivedSpan:
    found = [s for s in spans if all(getattr(s, k) == v for k, v in match.items())]
    assert len(found) == 1, (match, [(s.service_name, s.name) for s in spans])
    return found[0]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_one_trace_from_application_through_gateway_and_engine(stack: Stack, stream: bool):
    traceparent, trace_id, app_span_id = _traceparent()
    client = stack.client("quiet")
    messages = _messages(f"Do you repair tyres? By the way, {SECRET_WORDS}.")
    # Twice: the second request hits the first one's cached system prompt.
    for _ in range(2):
        if stream:
            with client.chat.completions.with_streaming_response.create(
                model="smollm2", messages=messages, max_tokens=6, stream=True,
                stream_options={"include_usage": True}, extra_headers={"traceparent": traceparent},
            ) as response:
                request_id = response.headers["x-request-id"]
                chunks = list(response.parse())
            response_id = chunks[0].id
            finish_reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        else:
            raw = client.chat.completions.with_raw_response.create(
                model="smollm2", messages=messages, max_tokens=6, extra_headers={"traceparent": traceparent}
            )
            request_id = raw.headers["x-request-id"]
            completion = raw.parse()
            response_id, finish_reasons = completion.id, [completion.choices[0].finish_reason]

    row = stored(stack.database_url, "requests", "id", [request_id])[request_id]
    spans = stack.receiver.wait_for(lambda _: len(stack.receiver.in_trace(trace_id)) >= 10)
    spans = stack.receiver.in_trace(trace_id)
    gateway = _one(spans, service_name="prefixscope-gateway", kind="server", span_id=_span_of(spans, request_id))
    # The application's span is the gateway span's parent; the gateway's is the engine's.
    assert gateway.parent_span_id == app_span_id
    engine = _one(spans, service_name="prefixscope-engine", kind="server", parent_span_id=gateway.span_id)
    phases = {s.name: s for s in spans if s.parent_span_id == engine.span_id}
    assert set(phases) == {"queue", "prefill", "decode"}
    assert engine.start_ns <= phases["queue"].start_ns <= phases["prefill"].start_ns <= phases["decode"].start_ns
    assert phases["decode"].end_ns <= engine.end_ns

    # GenAI attributes of the gateway span against the recorded row and the response the client saw.
    attributes = gateway.attributes
    assert gateway.name == "chat smollm2"
    assert attributes[genai.OPERATION_NAME] == "chat"
    assert attributes[genai.PROVIDER_NAME] == "prefixscope"
    assert attributes[genai.REQUEST_MODEL] == row["model"] == "smollm2"
    assert attributes[genai.RESPONSE_MODEL] == engine.attributes[genai.RESPONSE_MODEL]
    assert attributes[genai.RESPONSE_ID] == response_id == engine.attributes[genai.RESPONSE_ID]
    assert list(attributes[genai.RESPONSE_FINISH_REASONS]) == finish_reasons
    assert attributes[genai.INPUT_TOKENS] == row["prompt_tokens"] == engine.attributes[genai.INPUT_TOKENS]
    assert attributes[genai.OUTPUT_TOKENS] == row["completion_tokens"] == engine.attributes[genai.OUTPUT_TOKENS]
    assert attributes[genai.CACHE_READ_INPUT_TOKENS] == row["cached_tokens"] > 0
    assert attributes["prefixscope.request_id"] == request_id
    assert attributes["prefixscope.miss_reason"] == row["miss_reason"]
    assert attributes["prefixscope.cache.miss_kind"] == row["miss_kind"]
    assert attributes["prefixscope.cache.tier.device_tokens"] == row["cached_tokens_device"]
    assert attributes["prefixscope.stream"] is stream
    # The engine's prefill span says what came from cache and what was computed.
    prefill = phases["prefill"].attributes
    assert prefill["prefixscope.prefill.cached_tokens"] == row["cached_tokens"]
    assert prefill["prefixscope.prefill.computed_tokens"] == row["prompt_tokens"] - row["cached_tokens"]
    # This tenant does not store prompts: no span carries any of its text.
    for span in spans:
        for value in span.attributes.values():
            assert "locker" not in str(value), (span.name, value)
    assert stack.receiver.content_types == {"application/x-protobuf"}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_messages_api_span_names_the_message_its_model_and_stop_reason(stack: Stack, stream: bool):
    traceparent, trace_id, _ = _traceparent()
    client = anthropic.Anthropic(base_url=stack.gateway_url, api_key=stack.keys["quiet"], max_retries=0, timeout=120)
    request = {
        "model": "smollm2",
        "max_tokens": 4,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": "Do you sell helmets?"}],
        "extra_headers": {"traceparent": traceparent},
    }
    if stream:
        with client.messages.stream(**request) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**request)
    spans = stack.receiver.wait_for(lambda _: len(stack.receiver.in_trace(trace_id)) >= 5)
    gateway = _one(stack.receiver.in_trace(trace_id), service_name="prefixscope-gateway", kind="server")
    assert gateway.name == "chat smollm2"
    assert gateway.attributes[genai.RESPONSE_ID] == message.id
    assert gateway.attributes[genai.RESPONSE_MODEL] == message.model == "smollm2"
    assert list(gateway.attributes[genai.RESPONSE_FINISH_REASONS]) == [message.stop_reason]
    assert message.stop_reason in ("max_tokens", "end_turn")
    assert len(spans) >= 5


def _span_of(spans: list[ReceivedSpan], request_id: str) -> str:
    return next(s.span_id for s in spans if s.attributes.get("prefixscope.request_id") == request_id)


def test_prompt_text_only_for_a_tenant_that_stores_prompts(stack: Stack):
    traceparent, trace_id, _ = _traceparent()
    raw = stack.client("open").chat.completions.with_raw_response.create(
        model="smollm2", messages=_messages(SECRET_WORDS), max_tokens=2, extra_headers={"traceparent": traceparent}
    )
    request_id = raw.headers["x-request-id"]
    row = stored(stack.database_url, "requests", "id", [request_id])[request_id]
    spans = stack.receiver.wait_for(lambda _: len(stack.receiver.in_trace(trace_id)) >= 5)
    gateway = _one(stack.receiver.in_trace(trace_id), service_name="prefixscope-gateway")
    assert SECRET_WORDS in gateway.attributes[genai.PROMPT_TEXT]
    assert gateway.attributes[genai.PROMPT_TEXT] == row["prompt_text"]
    # The engine never puts prompt text in its spans.
    for span in spans:
        if span.service_name == "prefixscope-engine":
            assert not any("locker" in str(value) for value in span.attributes.values())


def test_export_outcomes_are_counted(stack: Stack):
    """Both programs count what became of their spans; with a reachable collector, every ended span is exported."""
    for url, prefix in ((stack.gateway_url, "prefixscope_gateway"), (stack.engine_url, "prefixscope_engine")):
        text = httpx.get(f"{url}/metrics", timeout=10).text
        assert f'{prefix}_trace_spans_total{{outcome="exported"}}' in text
        assert f'{prefix}_trace_spans_total{{outcome="failed"}} 0.0' in text
        assert f'{prefix}_trace_spans_total{{outcome="dropped"}} 0.0' in text


# What vLLM's V1 `PrometheusStatLogger` (vllm/v1/metrics/loggers.py) declares for the series the engine serves under
# its names: type and label names. `model_name` and `engine` label every one of them.
VLLM_SERIES = {
    "vllm:prefix_cache_queries": ("counter", ()),
    "vllm:prefix_cache_hits": ("counter", ()),
    "vllm:prompt_tokens": ("counter", ()),
    "vllm:prompt_tokens_by_source": ("counter", ("source",)),
    "vllm:prompt_tokens_cached": ("counter", ()),
    "vllm:generation_tokens": ("counter", ()),
    "vllm:num_preemptions": ("counter", ()),
    "vllm:request_success": ("counter", ("finished_reason",)),
    "vllm:num_requests_running": ("gauge", ()),
    "vllm:num_requests_waiting": ("gauge", ()),
    "vllm:kv_cache_usage_perc": ("gauge", ()),
    "vllm:time_to_first_token_seconds": ("histogram", ()),
    "vllm:inter_token_latency_seconds": ("histogram", ()),
    "vllm:request_time_per_output_token_seconds": ("histogram", ()),
    "vllm:e2e_request_latency_seconds": ("histogram", ()),
    "vllm:request_queue_time_seconds": ("histogram", ()),
    "vllm:request_prefill_time_seconds": ("histogram", ()),
    "vllm:request_decode_time_seconds": ("histogram", ()),
    "vllm:request_inference_time_seconds": ("histogram", ()),
}
REPO = Path(__file__).resolve().parents[2]
# Labels Prometheus adds to every scraped series, and the bucket bound of histogram samples.
SCRAPE_LABELS = {"instance", "job", "le"}


@dataclass
class Scraped:
    type: str
    labels: set[str]


def _scrape(url: str) -> tuple[dict[str, Scraped], dict[str, object]]:
    """Sample name -> its family's type and label names; and the families by name."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, Scraped] = {}
    families = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        families[family.name] = family
        for sample in family.samples:
            entry = samples.setdefault(sample.name, Scraped(family.type, set()))
            entry.labels.update(sample.labels)
    return samples, families


def test_engine_serves_vllm_series_with_vllm_types_and_labels(stack: Stack):
    stack.client("quiet").chat.completions.create(model="smollm2", messages=_messages("Hi"), max_tokens=3)
    _, families = _scrape(stack.engine_url)
    # (prometheus_client, which vLLM uses too, also writes a `_created` gauge per counter and histogram series.)
    served = {name for name in families if name.startswith("vllm:") and not name.endswith("_created")}
    assert served == set(VLLM_SERIES)
    for name, (kind, extra_labels) in VLLM_SERIES.items():
        family = families[name]
        assert family.type == kind, name
        labels = {label for sample in family.samples for label in sample.labels} - {"le"}
        assert labels == {"model_name", "engine", *extra_labels}, name
        assert {sample.labels["model_name"] for sample in family.samples} == {"smollm2"}


def test_every_series_the_board_and_rules_query_is_served(stack: Stack):
    from promql_names import board_queries, rules

    client = stack.client("quiet")
    messages = _messages("What are your opening hours?")
    for _ in range(2):  # the second one hits: hit and eligible counters move
        client.chat.completions.create(model="smollm2", messages=messages, max_tokens=3)
    engine, _ = _scrape(stack.engine_url)
    gateway, _ = _scrape(stack.gateway_url)
    scraped = {**engine, **gateway}
    rule_queries, recorded, alerts = rules(REPO / "deploy" / "prometheus" / "rules.yml")
    board = board_queries(REPO / "deploy" / "grafana" / "prefixscope.json")
    assert {alert["alert"] for alert in alerts} == {"PrefixCacheHitRateDrop", "TenantMissesDominatedByOneReason"}
    # The labels of each recorded series: what its rule groups by, and what the recorded series it reads carry.
    outputs: dict[str, set[str]] = {}
    for query in rule_queries:
        name = query.source.split("'")[1]
        if name in recorded:
            outputs[name] = query.grouping_labels.union(*(outputs.get(n, set()) for n in query.metrics))

    checked = set()
    for query in [*rule_queries, *board]:
        for name in query.metrics:
            checked.add(name)
            if name in recorded:
                # A recorded series has the labels its rule groups by.
                assert query.selector_labels.get(name, set()) <= outputs[name], (query.source, name)
                continue
            assert name in scraped, f"{query.source}: {name} is not served"
            series = scraped[name]
            expected = "histogram" if name.endswith("_bucket") else "counter" if name.endswith("_total") else "gauge"
            assert series.type == expected, (query.source, name, series.type)
            assert query.selector_labels.get(name, set()) <= series.labels, (query.source, name, series.labels)
        served_labels = set().union(
            *(scraped[n].labels for n in query.metrics if n in scraped),
            *(outputs[n] for n in query.metrics if n in recorded),
        )
        assert query.grouping_labels - SCRAPE_LABELS <= served_labels, (query.source, query.grouping_labels)
    # The board reads hit rates by tenant and replica, miss reasons, tiers and the vLLM-named engine series.
    assert {
        "prefixscope_gateway_tenant_cached_tokens_total",
        "prefixscope_gateway_tenant_eligible_prompt_tokens_total",
        "prefixscope_gateway_tenant_miss_reasons_total",
        "prefixscope_engine_tier_hit_tokens_total",
        "prefixscope_gateway_replica_cached_tokens_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_bucket",
    } <= checked
