"""The engine's HTTP API over real HTTP, on a tiny random Llama with SmolLM2's tokenizer."""

from __future__ import annotations

import json

import httpx
import pytest

from .server_fixtures import served_engine, wait_until

LONG_SYSTEM = "You are a careful assistant for the ACME returns desk. " * 30


@pytest.fixture(scope="module")
def server(tiny_loaded):
    with served_engine(tiny_loaded, admin_token="admin-secret", kv_cache_tokens=8192) as served:
        yield served


@pytest.fixture
def client(server):
    """A client holding the admin token, which the cache views need (test_access covers who may call what)."""
    base_url, _ = server
    with httpx.Client(base_url=base_url, timeout=60, headers={"authorization": "Bearer admin-secret"}) as http:
        yield http


def chat(content: str = "Where is my parcel?", **extra) -> dict:
    return {
        "model": "tiny-llama",
        "messages": [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": content}],
        "max_tokens": 6,
        "temperature": 0,
        **extra,
    }


def sse_events(response: httpx.Response) -> list:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line.removeprefix("data: ")
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_chat_completion_reports_cached_tokens_in_usage_headers_and_body(client):
    first = client.post("/v1/chat/completions", json=chat(cache_salt="server-test-1"))
    second = client.post("/v1/chat/completions", json=chat(cache_salt="server-test-1"))
    assert first.status_code == second.status_code == 200
    body = first.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert first.headers["x-prefix-cache-miss"] == "cold"
    prompt_tokens = body["usage"]["prompt_tokens"]
    warm = second.json()
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt_tokens - 1
    assert second.headers["x-prefix-cache-matched-tokens"] == str(prompt_tokens - 1)
    assert second.headers["x-prefix-cache-prompt-tokens"] == str(prompt_tokens)
    assert second.headers["x-prefix-cache-miss"] == "hit"
    assert {k: v for k, v in warm["prefix_cache"].items() if k not in ("ttft_ms", "load_ms", "segments")} == {
        "matched_tokens": prompt_tokens - 1, "prompt_tokens": prompt_tokens, "miss": "hit", "template_tokens": 3,
        "tiers": {"device": prompt_tokens - 1, "host": 0, "disk": 0}, "page_size": 1,
        "seen_tokens": prompt_tokens}  # the same prompt was computed before, whole
    assert [name for name, _ in warm["prefix_cache"]["segments"]] == ["system", "messages[1]"]
    assert warm["choices"][0]["message"]["content"] == body["choices"][0]["message"]["content"]


def test_streaming_sends_headers_chunks_usage_and_done(client):
    client.post("/v1/chat/completions", json=chat(cache_salt="server-test-2"))
    request = chat(cache_salt="server-test-2", stream=True, stream_options={"include_usage": True})
    with client.stream("POST", "/v1/chat/completions", json=request) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-prefix-cache-miss"] == "hit"
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] == 6
    assert usage["prompt_tokens_details"]["cached_tokens"] == int(response.headers["x-prefix-cache-matched-tokens"]) > 0


def test_streaming_without_include_usage_sends_no_usage_chunk(client):
    with client.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as response:
        assert response.status_code == 200
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    # A whole stream (an empty one would pass the checks below vacuously): the role, the text, the finish.
    assert len(chunks) >= 3
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(chunk["choices"] for chunk in chunks)
    assert all("usage" not in chunk for chunk in chunks)


def test_completions_accept_text_and_token_ids(client):
    text = client.post("/v1/completions", json={"model": "tiny-llama", "prompt": "Hello there", "max_tokens": 3})
    assert text.status_code == 200 and text.json()["object"] == "text_completion"
    ids = client.post("/v1/completions", json={"model": "tiny-llama", "prompt": [11, 12, 13, 14], "max_tokens": 3})
    assert ids.status_code == 200
    assert ids.json()["usage"]["prompt_tokens"] == 4
    with client.stream("POST", "/v1/completions", json={"model": "tiny-llama", "prompt": "Hi", "max_tokens": 3, "stream": True}) as response:
        chunks = [e for e in sse_events(response) if e != "[DONE]"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tiny-llama"}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "tiny-llama", "messages": []}, "messages"),
        ({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
        ({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6}, "max_tokens"),
        ({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi " * 5000}]}, "messages"),
        ({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "n": 17}, "n"),
        ({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "logprobs": "yes"}, "logprobs"),
        ({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "temperature": 5}, "temperature"),
        ({"model": "tiny-llama", "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ],
)
def test_bad_requests_get_an_openai_shaped_400_naming_the_problem(client, body, param):
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]


def test_an_unknown_model_is_openais_404(client):
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "hi"})):
        response = client.post(path, json={"model": "gpt-9", **body})
        assert response.status_code == 404
        assert response.json() == {"error": {
            "message": "The model `gpt-9` does not exist or you do not have access to it.",
            "type": "invalid_request_error", "param": None, "code": "model_not_found",
        }}


def test_malformed_json_is_a_400(client):
    response = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]["message"]


def test_models_health_and_metrics(client):
    assert client.get("/v1/models").json()["data"][0]["id"] == "tiny-llama"
    assert client.get("/health").json()["status"] == "ok"
    client.post("/v1/chat/completions", json=chat(cache_salt="metrics"))
    metrics = client.get("/metrics").text
    assert "prefixscope_engine_prompt_tokens_total" in metrics
    assert 'prefixscope_engine_requests_total{miss="cold"}' in metrics
    assert "prefixscope_engine_pool_used_tokens" in metrics
    assert "prefixscope_engine_tree_nodes" in metrics


def test_cache_api_stats_tree_and_dry_run_match(client):
    client.post("/v1/chat/completions", json=chat(cache_salt="dry-run"))
    stats = client.get("/v1/cache").json()
    assert stats["capacity_tokens"] == 8192 and stats["num_nodes"] > 0
    tree = client.get("/v1/cache/tree", params={"max_nodes": 50}).json()
    assert tree["namespaces"] and "dry-run" not in json.dumps(tree)
    before = client.get("/v1/cache").json()
    match = client.post("/v1/cache/match", json=chat("A different question", cache_salt="dry-run")).json()
    assert 0 < match["matched_tokens"] < match["prompt_tokens"] and match["miss"] == "partial"
    after = client.get("/v1/cache").json()
    assert (after["num_nodes"], after["cached_tokens"], after["requests_total"]) == (
        before["num_nodes"], before["cached_tokens"], before["requests_total"])


def test_flush_needs_the_admin_token(client):
    client.post("/v1/chat/completions", json=chat(cache_salt="flush"))
    assert client.post("/v1/cache/flush", headers={"authorization": ""}).status_code == 401
    assert client.post("/v1/cache/flush", headers={"authorization": "Bearer wrong"}).status_code == 401
    flushed = client.post("/v1/cache/flush", headers={"authorization": "Bearer admin-secret"})
    assert flushed.status_code == 200 and flushed.json()["flushed_tokens"] > 0
    assert client.get("/v1/cache").json()["cached_tokens"] == 0


def test_a_client_disconnecting_mid_stream_releases_locks_and_slots(server):
    base_url, engine = server
    generated_before = engine.counters.completion_tokens
    request = chat(cache_salt="disconnect", stream=True, max_tokens=2000, ignore_eos=True)
    with httpx.Client(base_url=base_url, timeout=60) as http:
        with http.stream("POST", "/v1/chat/completions", json=request) as response:
            lines = response.iter_lines()
            for _ in range(4):
                next(lines)
        # leaving the block closes the connection mid-stream
    assert wait_until(lambda: engine.cache_stats()["active_requests"] == 0)
    assert engine.counters.completion_tokens - generated_before < 2000  # stopped early, not run to the end
    assert engine.cache.protected_tokens == 0
    engine.check_integrity()


def test_a_non_streamed_request_whose_client_went_away_is_cancelled(server):
    base_url, engine = server
    generated_before = engine.counters.completion_tokens
    request = chat(cache_salt="gone", max_tokens=3000, ignore_eos=True)
    with httpx.Client(base_url=base_url, timeout=60) as http:
        with pytest.raises(httpx.ReadTimeout):
            # The client gives up long before 3000 tokens and closes the connection.
            http.post("/v1/chat/completions", json=request, timeout=httpx.Timeout(60, read=1.0))
    assert wait_until(lambda: engine.cache_stats()["active_requests"] == 0, timeout_s=60)
    assert engine.counters.completion_tokens - generated_before < 3000
    assert engine.cache.protected_tokens == 0
    engine.check_integrity()


def test_a_request_too_large_for_the_pool_is_a_503_and_others_still_work(tiny_loaded):
    with served_engine(tiny_loaded, kv_cache_tokens=64) as (base_url, _):
        with httpx.Client(base_url=base_url, timeout=60) as http:
            too_big = http.post("/v1/chat/completions", json=chat())
            assert too_big.status_code == 503
            assert too_big.json()["error"]["code"] == "kv_cache_full"
            small = {"model": "tiny-llama", "prompt": [5, 6, 7], "max_tokens": 2}
            assert http.post("/v1/completions", json=small).status_code == 200


def test_the_prompt_hash_chain_is_returned_on_request(client):
    body = client.post("/v1/chat/completions", json=chat(return_hash_chain=True, hash_block_size=16)).json()
    chain = body["prefix_cache"]["hash_chain"]
    assert chain["block_size"] == 16 and chain["input_length"] == body["usage"]["prompt_tokens"]
    assert len(chain["hash_ids"]) == chain["input_length"] // 16
    other = client.post("/v1/cache/match", json=chat("Another question, " * 12, return_hash_chain=True)).json()["hash_chain"]
    shared = sum(1 for x, y in zip(chain["hash_ids"], other["hash_ids"]) if x == y)
    assert 0 < shared < len(other["hash_ids"])  # the system prompt's blocks are shared, the question's are not
    plain = client.post("/v1/chat/completions", json=chat()).json()
    assert "hash_chain" not in plain["prefix_cache"]
    assert client.post("/v1/chat/completions", json=chat(return_hash_chain="yes")).status_code == 400
