"""The gateway's own request surface, fault kind by fault kind (stub upstream behind it): null means absent, bodies
it cannot use are 400s naming the field, no usage member on streams whose client did not ask, bad query values,
and a stored row for every request whatever its model name (SQLite and PostgreSQL)."""

from __future__ import annotations

import json

import httpx
import pytest
from gateway_testkit import db_storage, gateway_config, running_gateway, wait_until
from sqlalchemy import create_engine, text

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def post(url: str, raw: bytes, path: str = "/v1/chat/completions") -> httpx.Response:
    return httpx.post(f"{url}{path}", content=raw, headers={"content-type": "application/json"}, timeout=30)


def assert_openai_error(response: httpx.Response, status: int, param: str | None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param


def test_null_stream_and_stream_options_are_absent(gateway, stub):
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json={**CHAT, "stream": None, "stream_options": None})
    assert response.status_code == 200 and response.json()["object"] == "chat.completion"
    assert stub.state.requests[-1].get("stream_options") is None


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"model": "m\\ud83d", "messages": [{"role": "user", "content": "hi"}]}', "model"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "hi \\ud83d"}]}', "messages[0].content"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": '
         + b"[" * 1000 + b"]" * 1000 + b"}", "tools"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', "stream"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true, '
         b'"stream_options": {"include_usage": 1}}', "stream_options.include_usage"),
        (b'{"model": 5, "messages": [{"role": "user", "content": "hi"}]}', "model"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + b"9" * 5000 + b"}",
         "max_tokens"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": -1e400}', "temperature"),
        (b'{"model": "m", "messages": [{"role": ["user"], "content": "hi"}]}', "messages[0].role"),
    ],
)
def test_unusable_bodies_are_400s_naming_the_field(gateway, raw, param):
    assert_openai_error(post(gateway.url, raw), 400, param)


def test_deep_nesting_the_decoder_accepts_is_a_400_not_a_stack_overflow(gateway):
    tools = "[" * 990 + "]" * 990
    raw = ('{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
           '"function": {"name": "f", "parameters": {"x": ' + tools + "}}}]}").encode()
    assert_openai_error(post(gateway.url, raw), 400, "tools")
    assert httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT).status_code == 200


def test_streams_carry_no_usage_member_unless_the_client_asked(gateway):
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json={**CHAT, "stream": True}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert chunks and all("usage" not in chunk for chunk in chunks)
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body) as response:
        asked = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert all("usage" in chunk for chunk in asked) and asked[-1]["usage"]["total_tokens"] == 12


@pytest.mark.parametrize(
    ("params", "param"),
    [({"since": "3000000d"}, "since"), ({"until": "1e400h"}, "until"), ({"since": "x" * 5000}, "since"),
     ({"tenant": "a\x00b"}, "tenant"), ({"bucket": "b" * 300}, "bucket")],
)
def test_stats_query_values_that_cannot_be_used_are_400s(gateway, params, param):
    assert_openai_error(httpx.get(f"{gateway.url}/api/stats", params=params), 400, param)


def test_the_openapi_document_describes_the_hot_endpoints(gateway):
    document = httpx.get(f"{gateway.url}/openapi.json").json()
    assert document["openapi"] == "3.1.0"
    chat = document["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ChatCompletionRequest"
    }
    assert document["components"]["schemas"]["ChatCompletionRequest"]["required"] == ["model", "messages"]
    assert {p["name"] for p in document["paths"]["/api/stats"]["get"]["parameters"]} == {
        "since", "until", "bucket", "group_by", "tenant"}


def test_the_openapi_document_describes_the_responses_endpoints(gateway):
    document = httpx.get(f"{gateway.url}/openapi.json").json()
    post = document["paths"]["/v1/responses"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ResponsesRequest"}
    schema = document["components"]["schemas"]["ResponsesRequest"]
    assert schema["required"] == ["model", "input"]
    assert {"previous_response_id", "store", "text", "prompt_cache_key", "prompt_cache_retention"} <= set(
        schema["properties"])
    assert set(document["paths"]["/v1/responses/{response_id}"]) == {"get", "delete"}


def test_the_openapi_document_describes_the_messages_endpoints(gateway):
    document = httpx.get(f"{gateway.url}/openapi.json").json()
    schemas = document["components"]["schemas"]
    for path, name, required in (
        ("/v1/messages", "MessagesRequest", ["model", "messages", "max_tokens"]),
        ("/v1/messages/count_tokens", "CountTokensRequest", ["model", "messages"]),
    ):
        post = document["paths"][path]["post"]
        assert post["requestBody"]["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{name}"}
        assert schemas[name]["required"] == required
        assert {"system", "tools", "tool_choice"} <= set(schemas[name]["properties"])
        assert post["responses"]["400"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/AnthropicError"
        }
    assert {"temperature", "top_k", "stop_sequences", "metadata", "stream"} <= set(
        schemas["MessagesRequest"]["properties"]
    )
    assert {"apiKey", "bearer"} <= set(document["components"]["securitySchemes"])


LONG_MODEL = "m" * 250
NUL_MODEL = "model\x00name"


def _stored(url: str) -> dict[str, dict]:
    engine = create_engine(url.replace("+aiosqlite", "").replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            return {row.id: dict(row._mapping) for row in conn.execute(text("SELECT * FROM requests"))}
    finally:
        engine.dispose()


def _unstorable_traffic_is_stored(stub_url: str, url: str, tmp_path) -> None:
    storage = db_storage(url, tmp_path)
    with running_gateway(gateway_config(stub_url), storage) as gw:
        ids = {}
        for model in (LONG_MODEL, NUL_MODEL, "m"):
            response = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "model": model})
            assert response.status_code == 200
            ids[model] = response.headers["x-request-id"]
        assert wait_until(lambda: storage.sink.counters().written == 3)
        assert storage.sink.counters().dropped == 0
    rows = _stored(url)
    assert set(rows) == set(ids.values())
    long_row, nul_row, plain_row = (rows[ids[m]] for m in (LONG_MODEL, NUL_MODEL, "m"))
    assert long_row["model"] == "m" * 200
    assert "record_sanitized:model" in long_row["applied_rules"]
    assert nul_row["model"] == "model\ufffdname"
    assert "record_sanitized:model" in nul_row["applied_rules"]
    assert plain_row["model"] == "m" and not any(r.startswith("record_sanitized") for r in plain_row["applied_rules"])
    assert not (tmp_path / "spill" / "requests.jsonl.rejected").exists()


def test_unstorable_model_names_are_stored_cut_and_flagged_on_sqlite(stub, stub_url, tmp_path):
    _unstorable_traffic_is_stored(stub_url, f"sqlite:///{tmp_path}/gateway.db", tmp_path)


@pytest.mark.postgres
def test_unstorable_model_names_are_stored_cut_and_flagged_on_postgres(stub, stub_url, tmp_path, postgres_database):
    _unstorable_traffic_is_stored(stub_url, f"postgresql://root@127.0.0.1:5432/{postgres_database}", tmp_path)
