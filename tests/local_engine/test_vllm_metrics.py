"""The engine's series under vLLM's names: the figures a vLLM board reads, against what the requests did."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from local_engine.telemetry.vllm_metrics import TTFT_BUCKETS_S, ServingHistograms

from .server_fixtures import served_engine

SYSTEM = "You are the assistant of a small bakery; answer in one sentence. " * 12


@pytest.fixture(scope="module")
def server(tiny_loaded):
    with served_engine(tiny_loaded, kv_cache_tokens=4096) as served:
        yield served


def _samples(base_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted({"model_name": "tiny-llama", "engine": "0", **labels}.items())))
    return samples[key]


def test_vllm_series_count_what_the_requests_did(server):
    base_url, _ = server
    before = _samples(base_url)
    body = {"model": "tiny-llama", "max_tokens": 5, "temperature": 0, "ignore_eos": True, "cache_salt": "vllm-metrics",
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Bread?"}]}
    usages = [httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=60).json()["usage"] for _ in range(2)]
    after = _samples(base_url)

    def delta(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    prompt = sum(u["prompt_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert cached == usages[0]["prompt_tokens"] - 1  # the second request hit all but its last token
    assert delta("vllm:prefix_cache_queries_total") == delta("vllm:prompt_tokens_total") == prompt
    assert delta("vllm:prefix_cache_hits_total") == delta("vllm:prompt_tokens_cached_total") == cached
    assert delta("vllm:prompt_tokens_by_source_total", source="local_cache_hit") == cached
    assert delta("vllm:prompt_tokens_by_source_total", source="local_compute") == prompt - cached
    assert delta("vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    assert delta("vllm:generation_tokens_total") == sum(u["completion_tokens"] for u in usages) == 10
    assert delta("vllm:request_success_total", finished_reason="length") == 2
    assert delta("vllm:time_to_first_token_seconds_count") == 2
    assert delta("vllm:e2e_request_latency_seconds_count") == 2
    # Four intervals between five tokens, per request.
    assert delta("vllm:inter_token_latency_seconds_count") == 8
    assert delta("vllm:request_time_per_output_token_seconds_count") == 2
    # Histogram buckets are vLLM's, cumulative, and end at the count.
    bounds = sorted(float(dict(labels)["le"]) for name, labels in after
                    if name == "vllm:time_to_first_token_seconds_bucket")
    assert bounds == [*TTFT_BUCKETS_S, float("inf")]
    assert _value(after, "vllm:time_to_first_token_seconds_bucket", le="+Inf") == _value(
        after, "vllm:time_to_first_token_seconds_count"
    )
    # Idle: nothing running or waiting, and no slot held by a request (cached prefixes count as free, as in vLLM).
    assert _value(after, "vllm:num_requests_running") == 0
    assert _value(after, "vllm:num_requests_waiting") == 0
    assert _value(after, "vllm:kv_cache_usage_perc") == 0


def test_finish_reasons_take_vllms_names():
    histograms = ServingHistograms()
    histograms.observe_finish("cancelled", queued_s=0.01, prefill_s=0.0, ttft_s=0.0, decode_s=0.0, num_generated=0)
    histograms.observe_finish("stop", queued_s=0.0, prefill_s=0.02, ttft_s=0.02, decode_s=0.3, num_generated=4)
    assert histograms.finished_by_reason == {"abort": 1, "stop": 1}
    # A request cancelled before its first token has no TTFT; its end to end latency is its time in the queue.
    def sample(histogram, suffix: str) -> float:
        return next(s.value for s in histogram.collect()[0].samples if s.name.endswith(suffix))

    assert sample(histograms.ttft, "_count") == 1
    assert sample(histograms.e2e, "_count") == 2
    assert sample(histograms.e2e, "_sum") == pytest.approx(0.01 + 0.32)
