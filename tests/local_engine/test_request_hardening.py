"""The engine's request surface, fault kind by fault kind: null means absent, every bad value is a 400 naming its
field, documented defaults. A tiny random Llama with SmolLM2's tokenizer behind real HTTP."""

from __future__ import annotations

import json

import httpx
import pytest

from local_engine.api.openapi import CHAT_REQUEST, COMPLETION_REQUEST

from .server_fixtures import served_engine

MESSAGES = [{"role": "user", "content": "Where is my parcel?"}]
BASE = {"model": "tiny-llama", "messages": MESSAGES, "max_tokens": 3, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def client(tiny_loaded):
    with served_engine(tiny_loaded, kv_cache_tokens=8192) as (base_url, _), httpx.Client(
        base_url=base_url, timeout=60
    ) as http:
        yield http


def nested(levels: int) -> list:
    value: list = [1]
    for _ in range(levels - 1):
        value = [value]
    return value


def assert_openai_error(response: httpx.Response, status: int, param: str | None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    return error


def test_null_max_completion_tokens_keeps_max_tokens(client):
    body = {**BASE, "max_tokens": 5, "max_completion_tokens": None}
    answer = client.post("/v1/chat/completions", json=body).json()
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 5


def test_null_max_tokens_keeps_max_completion_tokens(client):
    answer = client.post("/v1/chat/completions", json={**BASE, "max_tokens": None, "max_completion_tokens": 4}).json()
    assert answer["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("field", sorted(set(CHAT_REQUEST["properties"]) - set(CHAT_REQUEST["required"])))
def test_every_optional_chat_field_may_be_null(client, field):
    body = {**BASE, field: None}
    if field == "max_tokens":
        body["max_completion_tokens"] = 3
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "chat.completion"
    if field != "ignore_eos":
        assert answer["usage"]["completion_tokens"] == 3
        assert answer["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("field", sorted(set(COMPLETION_REQUEST["properties"]) - set(COMPLETION_REQUEST["required"])))
def test_every_optional_completions_field_may_be_null(client, field):
    body = {"model": "tiny-llama", "prompt": "Once upon a time", "ignore_eos": True, "temperature": 0, field: None}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    if field != "ignore_eos":
        # max_tokens absent (or null): OpenAI's documented default of 16 tokens.
        assert response.json()["usage"]["completion_tokens"] == 16
        assert response.json()["choices"][0]["finish_reason"] == "length"


def test_null_stream_is_not_streamed(client):
    response = client.post("/v1/chat/completions", json={**BASE, "stream": None, "stream_options": None})
    assert response.status_code == 200 and response.json()["object"] == "chat.completion"


def test_completions_default_to_16_tokens(client):
    body = {"model": "tiny-llama", "prompt": "Once upon a time", "ignore_eos": True}
    assert client.post("/v1/completions", json=body).json()["usage"]["completion_tokens"] == 16


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"messages": [{"role": ["user"], "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": 5}]}, "messages[0].tool_calls"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"function": "f"}]}]}, "messages[0].tool_calls[0].function"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]},
         "messages[0].tool_calls[0].function.arguments"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "hi", "name": 3}]}, "messages[0].name"),
        ({"seed": 2**64}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"temperature": 1e-320}, "temperature"),
        ({"temperature": "0.5"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 10**40}, "max_tokens"),
        ({"max_completion_tokens": -1}, "max_completion_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
        ({"stop": [1]}, "stop"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": ""}, "stop"),
        ({"cache_salt": 5}, "cache_salt"),
        ({"return_hash_chain": "yes"}, "return_hash_chain"),
        ({"hash_block_size": 0}, "hash_block_size"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"user": 5}, "user"),
        ({"parallel_tool_calls": "x"}, "parallel_tool_calls"),
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
        ({"model": ["tiny-llama"]}, "model"),
        ({"model": "tiny\ud83d"}, "model"),
        ({"messages": [{"role": "user", "content": "hi \ud83d"}]}, "messages[0].content"),
        ({"metadata": {"deep": nested(70)}}, "metadata.deep" + "[0]" * 63),
    ],
)
def test_any_bad_value_is_a_400_naming_the_field(client, change, param):
    body = json.dumps({**BASE, **change}).encode()  # json.dumps keeps lone surrogates as \ud83d escapes
    response = client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert_openai_error(response, 400, param)


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"model": "tiny-llama", "prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", "max_tokens"),
        (b'{"model": "tiny-llama", "prompt": "hi", "temperature": 1e400}', "temperature"),
        (b'{"model": "tiny-llama", "prompt": "hi", "stop": ["a", -' + b"1" * 4500 + b"]}", "stop[1]"),
        (b'{"model": "tiny-llama", "prompt": "hi", "temperature": NaN}', None),
        (b'{"model": "tiny-llama", "prompt": ' + b"[" * 1000 + b"]" * 1000 + b"}", None),
        (b'{"model": "tiny-llama", "prompt": "\\ud83d"}', "prompt"),
        (b'{"model": "tiny-llama", "prompt": [[1, 2], [3]]}', "prompt"),
        (b'{"model": "tiny-llama", "prompt": [true]}', "prompt"),
        (b'{"model": "tiny-llama", "prompt": {}}', "prompt"),
        (b'{"model": "tiny-llama", "prompt": "hi", "suffix": "bye"}', "suffix"),
        (b'{"model": "tiny-llama", "prompt": "hi", "echo": "yes"}', "echo"),
    ],
)
def test_undecodable_and_odd_completions_bodies_are_400s(client, raw, param):
    response = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert_openai_error(response, 400, param)


def test_tiny_temperatures_are_greedy(client):
    greedy = client.post("/v1/chat/completions", json={**BASE, "max_tokens": 6}).json()
    tiny = client.post("/v1/chat/completions", json={**BASE, "max_tokens": 6, "temperature": 1e-300}).json()
    assert tiny["choices"][0]["message"]["content"] == greedy["choices"][0]["message"]["content"]


def test_cache_match_and_tree_take_the_same_care(client):
    assert_openai_error(client.post("/v1/cache/match", json={"model": "tiny-llama", "messages": None}), 400, "prompt")
    match = client.post("/v1/cache/match", json={"model": "tiny-llama", "messages": MESSAGES, "cache_salt": None})
    assert match.status_code == 200 and match.json()["prompt_tokens"] > 0
    assert_openai_error(client.get("/v1/cache/tree", params={"max_nodes": -1}), 400, "max_nodes")
    assert_openai_error(client.get("/v1/cache/tree", params={"max_nodes": "many"}), 400, "max_nodes")


def test_openapi_document_describes_the_request_bodies(client):
    document = client.get("/openapi.json").json()
    assert document["openapi"] == "3.1.0"
    schemas = document["components"]["schemas"]
    assert schemas["ChatCompletionRequest"]["required"] == ["model", "messages"]
    assert "tool_choice" in schemas["ChatCompletionRequest"]["properties"]
    body = document["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/CompletionRequest"}
