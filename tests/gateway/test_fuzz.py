"""Property-based fuzzing of both programs from the OpenAPI documents they serve: bounded batches of generated and
mutated requests; no 5xx, OpenAI-shaped errors, the server still answers a normal request afterwards, and the
gateway stores exactly one row per request. The engine is a tiny random Llama (SmolLM2's tokenizer, a 128-token
window so that no answer is long)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from gateway_testkit import db_storage, gateway_config, running_gateway, serve_in_thread, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schema_fuzz import check_answer, encode, request_bodies
from sqlalchemy import create_engine, text

MODEL = "tiny-llama"
FUZZ = settings(max_examples=40, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
NORMAL = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def tiny_engine_url() -> Iterator[str]:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from local_engine.config import EngineConfig, ServerConfig
    from local_engine.engine.engine import Engine
    from local_engine.model.loader import smollm2_directory, wrap_model
    from local_engine.api.server import create_app

    tokenizer = AutoTokenizer.from_pretrained(
        smollm2_directory(), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", local_files_only=True
    )
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                         eos_token_id=2, bos_token_id=1)
    loaded = wrap_model(LlamaForCausalLM(config).eval(), tokenizer, MODEL)
    engine = Engine(EngineConfig(kv_cache_tokens=4096), loaded)
    engine.start()
    try:
        with serve_in_thread(create_app(engine, ServerConfig())) as url:
            yield url
    finally:
        engine.stop()


def strategies(document: dict[str, Any]) -> dict[str, Any]:
    components = document["components"]["schemas"]
    overrides = {"model": st.sampled_from([MODEL, MODEL, "other"]), "max_tokens": st.integers(1, 6),
                 "max_completion_tokens": st.integers(1, 6)}
    return {
        "/v1/chat/completions": request_bodies(components["ChatCompletionRequest"], components, overrides),
        "/v1/completions": request_bodies(components["CompletionRequest"], components, overrides),
    }


def fuzz(base_url: str, document: dict[str, Any], sent: list[str], headers: dict[str, str] | None = None) -> None:
    bodies = strategies(document)

    @FUZZ
    @given(st.sampled_from(sorted(bodies)).flatmap(lambda path: st.tuples(st.just(path), bodies[path])))
    def one(case: tuple[str, dict[str, Any]]) -> None:
        path, body = case
        response = httpx.post(f"{base_url}{path}", content=encode(body), timeout=60,
                              headers={"content-type": "application/json", **(headers or {})})
        check_answer(response)
        if "x-request-id" in response.headers:
            sent.append(response.headers["x-request-id"])

    one()


def test_the_engine_answers_every_generated_request(tiny_engine_url):
    document = httpx.get(f"{tiny_engine_url}/openapi.json").json()
    fuzz(tiny_engine_url, document, [])
    assert httpx.post(f"{tiny_engine_url}/v1/chat/completions", json=NORMAL, timeout=60).status_code == 200


def test_the_gateway_answers_and_records_every_generated_request(tiny_engine_url, tmp_path):
    database_url = f"sqlite:///{tmp_path}/gateway.db"
    storage = db_storage(database_url, tmp_path)
    with running_gateway(gateway_config(tiny_engine_url), storage) as gw:
        assert httpx.get(f"{gw.url}/openapi.json").status_code == 200
        sent: list[str] = []
        # Bodies from the upstream's schema: the gateway passes every field it does not read on to it.
        fuzz(gw.url, httpx.get(f"{tiny_engine_url}/openapi.json").json(), sent)

        @settings(FUZZ, max_examples=20)
        @given(st.dictionaries(st.sampled_from(["since", "until", "bucket", "group_by", "tenant"]),
                               st.sampled_from(["24h", "3000000d", "1e400h", "now", "2025-01-01", "x", "", "\x00",
                                                "tenant", "1d", "9" * 400]), max_size=3))
        def stats(params: dict[str, str]) -> None:
            check_answer(httpx.get(f"{gw.url}/api/stats", params=params, timeout=30), success_member="data")

        stats()
        normal = httpx.post(f"{gw.url}/v1/chat/completions", json=NORMAL, timeout=60)
        assert normal.status_code == 200
        sent.append(normal.headers["x-request-id"])
        assert wait_until(lambda: storage.sink.counters().written == len(sent))
        counters = storage.sink.counters()
        assert (counters.dropped, counters.spilled) == (0, 0)
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            stored = [row.id for row in conn.execute(text("SELECT id FROM requests"))]
    finally:
        engine.dispose()
    assert sorted(stored) == sorted(sent)


@pytest.fixture(scope="module")
def tiny_gateway_url(tiny_engine_url: str) -> Iterator[str]:
    with running_gateway(gateway_config(tiny_engine_url)) as gw:
        yield gw.url


def _optional(schema_name: str) -> list[str]:
    from local_engine.api.openapi import CHAT_REQUEST, COMPLETION_REQUEST

    schema = {"chat": CHAT_REQUEST, "completions": COMPLETION_REQUEST}[schema_name]
    return sorted(set(schema["properties"]) - set(schema["required"]) - {"ignore_eos"})


@pytest.mark.parametrize("field", _optional("chat"))
def test_every_optional_chat_field_may_be_null_through_the_gateway(tiny_gateway_url, field):
    body = {**NORMAL, "max_tokens": 3, "ignore_eos": True, field: None}
    if field == "max_tokens":
        body["max_completion_tokens"] = 3
    answer = httpx.post(f"{tiny_gateway_url}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 3
    assert answer.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("field", _optional("completions"))
def test_every_optional_completions_field_may_be_null_through_the_gateway(tiny_gateway_url, field):
    body = {"model": MODEL, "prompt": "Once upon a time", "ignore_eos": True, field: None}
    answer = httpx.post(f"{tiny_gateway_url}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 16  # the documented default


def test_an_unknown_model_through_the_gateway_is_openais_404(tiny_gateway_url):
    for model in ("no-such-model", "x" * 5000, "a\x00b", "<|im_end|>"):
        response = httpx.post(f"{tiny_gateway_url}/v1/chat/completions", json={**NORMAL, "model": model}, timeout=60)
        assert response.status_code == 404
        error = response.json()["error"]
        assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", None, "model_not_found")
        assert len(error["message"]) < 400
    assert error == {"message": "The model `<|im_end|>` does not exist or you do not have access to it.",
                     "type": "invalid_request_error", "param": None, "code": "model_not_found"}


def test_an_unknown_model_on_the_messages_api_is_anthropics_404(tiny_gateway_url):
    body = {"model": "no-such-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    for stream in (False, True):
        response = httpx.post(f"{tiny_gateway_url}/v1/messages", json={**body, "stream": stream}, timeout=60)
        assert response.status_code == 404
        assert response.json() == {"type": "error", "error": {"type": "not_found_error", "message": "model: no-such-model"}}
    long_name = httpx.post(f"{tiny_gateway_url}/v1/messages", json={**body, "model": "x" * 5000}, timeout=60)
    assert long_name.status_code == 404 and len(long_name.json()["error"]["message"]) < 400
    counted = httpx.post(f"{tiny_gateway_url}/v1/messages/count_tokens",
                         json={"model": "no-such-model", "messages": body["messages"]}, timeout=60)
    assert counted.status_code == 404
    assert counted.json() == {"type": "error", "error": {"type": "not_found_error", "message": "model: no-such-model"}}


def test_the_gateway_documents_every_field_the_engine_does(tiny_gateway_url, tiny_engine_url):
    gateway_schemas = httpx.get(f"{tiny_gateway_url}/openapi.json").json()["components"]["schemas"]
    engine_schemas = httpx.get(f"{tiny_engine_url}/openapi.json").json()["components"]["schemas"]
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        assert set(gateway_schemas[name]["properties"]) == set(engine_schemas[name]["properties"])
        assert gateway_schemas[name]["required"] == engine_schemas[name]["required"]
