"""The tiered cache on the HTTP surface, on a tiny random Llama: the `cache_retention` body field, the per-tier
split of matched tokens in bodies, usage chunks and the `x-prefix-cache-tiers` header, `/v1/cache` `tiers` and the
per-tier Prometheus series."""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from local_engine.cache.tiers import HEADER_TIERS, RETENTION_CLASSES, TIER_COUNTERS, TIER_GAUGES, TierTokens
from local_engine.api.protocol import CHAT, COMPLETIONS, parse_request

from .server_fixtures import served_engine

SYSTEM = "You are the help desk of a bicycle shop; answer briefly and politely. " * 20


@pytest.fixture(scope="module")
def client(tiny_loaded):
    with served_engine(tiny_loaded, admin_token="admin", kv_cache_tokens=8192) as (base_url, _), httpx.Client(
        base_url=base_url, timeout=60, headers={"authorization": "Bearer admin"}
    ) as http:
        yield http


def chat(salt: str, question: str = "Do you fix flat tyres?", **extra) -> dict:
    return {
        "model": "tiny-llama",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 4,
        "temperature": 0,
        "cache_salt": salt,
        **extra,
    }


@pytest.mark.parametrize("retention", [*RETENTION_CLASSES, None])
def test_every_retention_class_is_accepted_on_both_endpoints(client, tiny_loaded, retention):
    body = chat("retention-ok", cache_retention=retention)
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    completion = {"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": 2, "cache_retention": retention}
    assert client.post("/v1/completions", json=completion).status_code == 200
    # What the server hands the engine: the class as sent (None leaves the engine's default).
    assert parse_request(body, CHAT, tiny_loaded).retention == retention
    assert parse_request(completion, COMPLETIONS, tiny_loaded).retention == retention


@pytest.mark.parametrize("value", ["10m", "PERSISTENT", "", 300, True, ["5m"], {"ttl": "5m"}])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_an_unknown_retention_class_is_an_openai_shaped_400(client, path, value):
    body = chat("retention-bad") if path.endswith("chat/completions") else {"model": "tiny-llama", "prompt": "Hi"}
    response = client.post(path, json={**body, "cache_retention": value})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "cache_retention"
    assert "5m" in error["message"] and "persistent" in error["message"]


def test_the_openapi_document_lists_the_retention_classes(client):
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        field = schemas[name]["properties"]["cache_retention"]
        assert {"enum": list(RETENTION_CLASSES)} in [
            {k: v for k, v in option.items() if k == "enum"} for option in field["anyOf"]]


def test_a_body_reports_its_cached_tokens_by_tier_in_the_body_and_the_header(client):
    first = client.post("/v1/chat/completions", json=chat("tiers-body"))
    second = client.post("/v1/chat/completions", json=chat("tiers-body", cache_retention="1h"))
    assert first.status_code == second.status_code == 200
    assert TierTokens.parse_header(first.headers[HEADER_TIERS]) == TierTokens()
    assert first.json()["prefix_cache"]["tiers"] == {"device": 0, "host": 0, "disk": 0}
    body = second.json()
    cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == body["usage"]["prompt_tokens"] - 1
    tiers = body["prefix_cache"]["tiers"]
    assert set(tiers) == {"device", "host", "disk"} and sum(tiers.values()) == cached
    assert tiers["device"] == cached  # this engine has no lower tier: everything came from the device
    assert TierTokens.parse_header(second.headers[HEADER_TIERS]) == TierTokens(**tiers)
    assert isinstance(body["prefix_cache"]["load_ms"], float) and body["prefix_cache"]["load_ms"] >= 0


def test_a_stream_sends_the_tiers_header_and_the_split_in_its_usage_chunk(client):
    client.post("/v1/chat/completions", json=chat("tiers-stream"))
    request = chat("tiers-stream", stream=True, stream_options={"include_usage": True})
    with client.stream("POST", "/v1/chat/completions", json=request) as response:
        header = TierTokens.parse_header(response.headers[HEADER_TIERS])
        chunks = [json.loads(line.removeprefix("data: ")) for line in response.iter_lines()
                  if line.startswith("data: {")]
    usage_chunk = chunks[-1]
    cached = usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and header.total == cached
    assert usage_chunk["prefix_cache"]["tiers"] == header.as_dict()
    assert usage_chunk["prefix_cache"]["load_ms"] >= 0
    # A stream without a usage chunk still says where its prefix came from, in the header.
    with client.stream("POST", "/v1/chat/completions", json=chat("tiers-stream", stream=True)) as response:
        assert TierTokens.parse_header(response.headers[HEADER_TIERS]).total == cached
        response.read()


def test_a_dry_run_match_reports_the_split_too(client):
    client.post("/v1/chat/completions", json=chat("tiers-dry-run"))
    match = client.post("/v1/cache/match", json=chat("tiers-dry-run", "Another question")).json()
    assert sum(match["tiers"].values()) == match["matched_tokens"] > 0
    refused = client.post("/v1/cache/match", json={**chat("tiers-dry-run"), "cache_retention": "bogus"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "cache_retention"


def test_the_cache_api_reports_every_tier_with_every_field(client):
    client.post("/v1/chat/completions", json=chat("tiers-stats"))
    client.post("/v1/chat/completions", json=chat("tiers-stats"))
    stats = client.get("/v1/cache").json()
    tiers = stats["tiers"]
    assert list(tiers) == ["device", "host", "disk"]
    for figures in tiers.values():
        assert set(figures) == {"enabled", *TIER_GAUGES, *TIER_COUNTERS}
    device = tiers["device"]
    assert device["enabled"] is True
    assert device["capacity_tokens"] == stats["capacity_tokens"] == 8192
    assert device["cached_tokens"] == stats["cached_tokens"] > 0
    assert device["hit_tokens_total"] > 0
    assert tiers["host"]["enabled"] is False and tiers["host"]["capacity_tokens"] == 0
    assert tiers["disk"]["enabled"] is False and tiers["disk"]["corrupt_files_total"] == 0


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_metrics_expose_every_tier_under_the_tier_label(client):
    client.post("/v1/chat/completions", json=chat("tiers-metrics"))
    client.post("/v1/chat/completions", json=chat("tiers-metrics"))
    samples = _samples(client.get("/metrics").text)
    stats = client.get("/v1/cache").json()["tiers"]
    names = ["prefixscope_engine_tier_cached_tokens", "prefixscope_engine_tier_capacity_tokens",
             "prefixscope_engine_tier_hit_tokens_total", "prefixscope_engine_tier_loads_total",
             "prefixscope_engine_tier_load_seconds_total", "prefixscope_engine_tier_demoted_tokens_total",
             "prefixscope_engine_tier_dropped_tokens_total"]
    for name in names:
        for tier in ("device", "host", "disk"):
            assert (name, (("tier", tier),)) in samples, (name, tier)
    assert samples[("prefixscope_engine_tier_capacity_tokens", (("tier", "device"),))] == 8192
    assert samples[("prefixscope_engine_tier_hit_tokens_total", (("tier", "device"),))] == \
        stats["device"]["hit_tokens_total"] > 0
    assert samples[("prefixscope_engine_disk_corrupt_files_total", ())] == 0


def test_a_prompt_sent_as_token_ids_reports_its_split_too(client):
    body = {"model": "tiny-llama", "prompt": list(range(100, 400)), "max_tokens": 2, "cache_salt": "tiers-ids"}
    client.post("/v1/completions", json=body)
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200
    answer = response.json()
    assert answer["prefix_cache"]["tiers"] == {"device": 299, "host": 0, "disk": 0}
    assert TierTokens.parse_header(response.headers[HEADER_TIERS]).total == 299
