"""The Messages API through the gateway with the official `anthropic` package, in front of stub upstreams: a chat
upstream (the OpenAI-shaped stub, also answering with tool calls) and an Anthropic-compatible one (pass-through)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import pytest
from anthropic_stub import STUB_USAGE, AnthropicStub
from gateway_testkit import (
    FakeStorage,
    RunningGateway,
    closed_port,
    gateway_config,
    running_gateway,
    serve_in_thread,
)
from stub_upstream import STUB_TOOL_CALL

from gateway.config import UpstreamConfig

TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]


def client(gw: RunningGateway, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0, timeout=30)


def sse_events(raw: bytes) -> list[tuple[str, dict]]:
    events = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_plain_message_in_anthropics_shape(gateway, stub):
    response = client(gateway).messages.with_raw_response.create(
        model="stub-model",
        max_tokens=16,
        system="Be brief.",
        messages=[{"role": "user", "content": "Hello"}],
        stop_sequences=["END"],
        metadata={"user_id": "user-7"},
        # This SDK release no longer has parameters for the sampling fields; the API still takes them.
        extra_body={"temperature": 0.2, "top_p": 0.9, "top_k": 5},
        extra_headers={"anthropic-version": "2023-06-01"},
    )
    message = response.parse()
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert [(b.type, b.text) for b in message.content] == [("text", "ok")]
    assert (message.stop_reason, message.stop_sequence, message.model) == ("end_turn", None, "stub-model")
    # No breakpoint: nothing reported as cached (the stub said 4 of 10 prompt tokens matched).
    usage = message.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (10, 0, 0)
    assert usage.output_tokens == 2
    assert response.headers["x-prefix-cache-miss"] == "partial"
    assert response.headers["x-prefix-cache-prompt-tokens"] == "10"
    sent = stub.state.requests[-1]
    assert stub.state.paths[-1] == "/v1/chat/completions"
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    assert (sent["max_tokens"], sent["temperature"], sent["top_p"], sent["top_k"]) == (16, 0.2, 0.9, 5)
    assert (sent["stop"], sent["user"]) == (["END"], "user-7")
    assert isinstance(sent["cache_salt"], str) and len(sent["cache_salt"]) == 64
    (record,) = gateway.wait_records(1)
    assert record.request_id == response.headers["x-request-id"] == response.headers["request-id"]
    assert (record.endpoint, record.status_code, record.model, record.stream) == ("messages", 200, "stub-model", False)
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (10, 0, 2)
    assert (record.cache_write_tokens, record.retention_class) == (0, None)
    assert record.miss_reason is not None


def test_breakpoint_without_positions_reports_the_engines_reads(gateway, stub):
    # The stub's dry-run match returns no hash chain, so positions are unknown: reads are the matched tokens.
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    message = client(gateway).messages.create(
        model="stub-model", max_tokens=4, system=system, messages=[{"role": "user", "content": "Hi"}]
    )
    usage = message.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (6, 4, 0)
    (record,) = gateway.wait_records(1)
    assert (record.cached_tokens, record.cache_write_tokens, record.retention_class) == (4, 0, "1h")
    assert len(stub.state.match_requests) == 2  # the whole request and the cut at the breakpoint
    assert stub.state.match_requests[1]["messages"] == [{"role": "system", "content": "Be brief."}]
    assert all(m["return_hash_chain"] is True and m["hash_block_size"] == 1 for m in stub.state.match_requests)


def test_tool_use_round_trip_maps_to_and_from_openai_tool_calls(gateway, stub):
    sdk = client(gateway)
    first = sdk.messages.create(
        model="tool-calls",
        max_tokens=32,
        tools=TOOLS,
        tool_choice={"type": "auto"},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["text", "tool_use"]
    tool_use = first.content[1]
    assert (tool_use.id, tool_use.name, tool_use.input) == (
        STUB_TOOL_CALL["id"],
        "get_weather",
        json.loads(STUB_TOOL_CALL["arguments"]),
    )
    assert stub.state.requests[-1]["tools"] == [
        {
            "function": {
                "description": "The weather in a city.",
                "name": "get_weather",
                "parameters": {"properties": {"city": {"type": "string"}}, "required": ["city"], "type": "object"},
            },
            "type": "function",
        }
    ]
    assert stub.state.requests[-1]["tool_choice"] == "auto"
    second = sdk.messages.create(
        model="stub-model",
        max_tokens=32,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "21 C, sunny"}],
            },
        ],
    )
    assert second.stop_reason == "end_turn"
    sent = stub.state.requests[-1]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["messages"][1:] == [
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": STUB_TOOL_CALL["id"],
                    "type": "function",
                    # The tool_use re-sent as returned reaches the upstream as the text it wrote (and cached).
                    "function": {"name": "get_weather", "arguments": STUB_TOOL_CALL["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": STUB_TOOL_CALL["id"], "content": "21 C, sunny"},
    ]


def test_streamed_tool_calls_become_tool_use_blocks(gateway, stub):
    with client(gateway).messages.stream(
        model="tool-calls", max_tokens=32, tools=TOOLS, messages=[{"role": "user", "content": "Weather?"}]
    ) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "tool_use"
    assert [b.type for b in message.content] == ["text", "tool_use"]
    assert message.content[0].text == "Hello"
    assert message.content[1].input == json.loads(STUB_TOOL_CALL["arguments"])
    assert message.usage.output_tokens == 2 and message.usage.input_tokens == 10
    (record,) = gateway.wait_records(1)
    assert (record.endpoint, record.stream, record.status_code, record.completion_tokens) == ("messages", True, 200, 2)
    assert record.ttft_ms is not None


def test_stream_has_anthropics_full_event_sequence(gateway, stub):
    body = {"model": "stub-model", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    response = httpx.post(f"{gateway.url}/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.content)
    assert [name for name, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["usage"]["input_tokens"] == 10 and start["usage"]["output_tokens"] == 0
    assert "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta") == "Hello world"
    assert events[-2][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert events[-2][1]["usage"] == {
        "input_tokens": 10,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 2,
    }
    assert "stream_options" in stub.state.requests[-1]  # usage asked for on the client's behalf


@pytest.mark.parametrize(
    ("body", "status", "error_type", "needle"),
    [
        (b"{not json", 400, "invalid_request_error", "could not parse the JSON body"),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
            },
            400,
            "invalid_request_error",
            "'image' are not supported",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}] * 5,
                "messages": [{"role": "user", "content": "x"}],
            },
            400,
            "invalid_request_error",
            "A maximum of 4 blocks with cache_control",
        ),
        (
            {"model": "err-429", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
            429,
            "rate_limit_error",
            "stub says no",
        ),
    ],
)
def test_errors_have_anthropics_shape_and_are_recorded(gateway, stub, body, status, error_type, needle):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(f"{gateway.url}/v1/messages", content=content, headers={"content-type": "application/json"})
    assert response.status_code == status
    payload = response.json()
    assert payload["type"] == "error" and payload["error"]["type"] == error_type
    assert needle in payload["error"]["message"]
    (record,) = gateway.wait_records(1)
    assert (record.endpoint, record.status_code) == ("messages", status)


def test_prefill_and_thinking_are_refused_on_a_chat_upstream(gateway, stub):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(gateway).messages.create(
            model="m",
            max_tokens=5,
            messages=[{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi"}],
        )
    assert caught.value.body["error"]["message"].startswith("messages[1]: a final assistant message (a prefill")
    with pytest.raises(anthropic.BadRequestError) as thinking:
        client(gateway).messages.create(
            model="m",
            max_tokens=2048,
            thinking={"type": "enabled", "budget_tokens": 1024},
            messages=[{"role": "user", "content": "Think"}],
        )
    assert (
        thinking.value.body["error"]["message"] == "thinking: extended thinking is not supported on the upstream 'stub'"
    )
    assert stub.state.requests == []


@pytest.mark.parametrize("where", ["tool schema", "tool input"])
def test_deeply_nested_values_are_a_400(gateway, stub, where):
    deep = '{"a":' * 1000 + "1" + "}" * 1000
    user = '{"role":"user","content":"hi"}'
    if where == "tool schema":
        body = (
            '{"model":"m","max_tokens":4,"tools":[{"name":"t","input_schema":' + deep + '}],"messages":[' + user + "]}"
        )
    else:
        tool_use = '{"role":"assistant","content":[{"type":"tool_use","id":"x","name":"t","input":' + deep + "}]}"
        body = '{"model":"m","max_tokens":4,"messages":[' + tool_use + "," + user + "]}"
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        response = httpx.post(gateway.url + path, content=body, headers={"content-type": "application/json"})
        assert response.status_code == 400
        error = response.json()["error"]
        # The message names the nesting (the shared JSON decoder may refuse it first, in its own words).
        assert error["type"] == "invalid_request_error" and "nest" in error["message"]
    (record,) = gateway.wait_records(1)
    assert (record.endpoint, record.status_code) == ("messages", 400)
    assert stub.state.requests == []


def test_sdk_raises_its_typed_errors(gateway):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(gateway).messages.create(
            model="m",
            max_tokens=5,
            messages=[{"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": "s"}]}],
        )
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "'thinking' are not supported" in caught.value.body["error"]["message"]


def test_x_api_key_and_bearer_both_authenticate(stub, stub_url):
    storage = FakeStorage()
    secret = storage.add_key("k1", "acme")
    with running_gateway(gateway_config(stub_url, auth="keys"), storage) as gw:
        ok = client(gw, secret).messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        assert ok.content[0].text == "ok"
        bearer = anthropic.Anthropic(base_url=gw.url, auth_token=secret, max_retries=0)
        assert bearer.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}]).id
        with pytest.raises(anthropic.AuthenticationError) as caught:
            client(gw, "wrong").messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        assert caught.value.body["type"] == "error"
        assert caught.value.body["error"]["type"] == "authentication_error"
        missing = httpx.post(f"{gw.url}/v1/messages", json={"model": "m", "max_tokens": 4, "messages": []})
        assert missing.status_code == 401
        assert missing.json() == {
            "type": "error",
            "error": {
                "type": "authentication_error",
                "message": "You didn't provide an API key. Send it in the x-api-key header.",
            },
        }
        counted = httpx.post(
            f"{gw.url}/v1/messages/count_tokens", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert counted.status_code == 401 and counted.json()["error"]["type"] == "authentication_error"
        records = gw.wait_records(4)
        assert [(r.tenant, r.key_id, r.status_code) for r in records] == [
            ("acme", "k1", 200),
            ("acme", "k1", 200),
            ("unauthenticated", None, 401),
            ("unauthenticated", None, 401),
        ]


def test_count_tokens_on_the_engine(gateway, stub):
    counted = client(gateway).messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
    assert counted.input_tokens == 10  # the stub's dry-run match: prompt_tokens
    assert stub.state.match_requests[-1]["messages"] == [{"role": "user", "content": "hi"}]
    assert gateway.records == []  # counting is not a completion request


def test_count_tokens_with_the_engine_down_is_a_502_not_a_client_error():
    with running_gateway(gateway_config(f"http://127.0.0.1:{closed_port()}")) as gw:
        with pytest.raises(anthropic.APIStatusError) as caught:
            client(gw).messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 502
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "api_error"
    assert "unavailable" in caught.value.body["error"]["message"]


@pytest.mark.parametrize(
    ("engine_status", "status", "error_type"),
    [(400, 400, "invalid_request_error"), (500, 502, "api_error"), (503, 502, "api_error")],
)
def test_count_tokens_keeps_client_errors_and_server_errors_apart(gateway, stub, engine_status, status, error_type):
    stub.state.match_status = engine_status
    with pytest.raises(anthropic.APIStatusError) as caught:
        client(gateway).messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == status
    assert caught.value.body["error"]["type"] == error_type


# --- an Anthropic-compatible upstream: pass-through ------------------------------------------------------------------


@pytest.fixture
def anthropic_gateway(tmp_path) -> Iterator[tuple[RunningGateway, AnthropicStub]]:
    stub = AnthropicStub()
    with serve_in_thread(stub) as url:
        upstream = UpstreamConfig(name="claude", url=url, kind="anthropic", api_key="sk-upstream", timeout_s=30)
        config = gateway_config(url, upstreams=(upstream,), default_upstream="claude")
        with running_gateway(config) as gw:
            yield gw, stub


def sdk_version_header(gw: RunningGateway) -> str:
    return client(gw).default_headers["anthropic-version"]


def test_passthrough_plain_normalizes_and_reads_anthropic_usage(anthropic_gateway):
    gw, stub = anthropic_gateway
    tools = [
        {"name": "b_tool", "input_schema": {"type": "object", "properties": {}}},
        {
            "name": "a_tool",
            "input_schema": {"properties": {}, "type": "object"},
            "cache_control": {"type": "ephemeral", "ttl": "1h"},
        },
    ]
    body = {
        "model": "claude-x",
        "max_tokens": 10,
        "tools": tools,
        "system": [{"type": "text", "text": "Sys\r\ntem", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "Hi"}],
        "cache_salt": "client-chosen",
    }
    response = client(gw).messages.with_raw_response.create(
        **{k: v for k, v in body.items() if k != "cache_salt"}, extra_body={"cache_salt": "x"}
    )
    message = response.parse()
    assert (response.headers["x-prefix-cache-matched-tokens"], response.headers["x-prefix-cache-prompt-tokens"]) == (
        "100",
        "137",
    )
    assert message.content[0].text == "Hi there"
    assert message.usage.cache_read_input_tokens == 100
    sent = stub.state.requests[-1]
    assert stub.state.paths[-1] == "/v1/messages"
    assert [t["name"] for t in sent["tools"]] == ["a_tool", "b_tool"]
    # The breakpoint stays where it was (after the second tool): the same tools stay before it.
    assert "cache_control" not in sent["tools"][0]
    assert sent["tools"][1]["cache_control"] == {"ttl": "1h", "type": "ephemeral"}
    assert list(sent["tools"][1]["input_schema"]) == ["properties", "type"]
    assert sent["system"][0]["text"] == "Sys\ntem"
    assert "cache_salt" not in sent
    headers = stub.state.headers[-1]
    assert headers["x-api-key"] == "sk-upstream"
    assert headers["anthropic-version"] == sdk_version_header(gw)  # the client's version, passed on
    assert "authorization" not in headers
    (record,) = gw.wait_records(1)
    assert (record.endpoint, record.upstream, record.status_code) == ("messages", "claude", 200)
    prompt = (
        STUB_USAGE["input_tokens"] + STUB_USAGE["cache_read_input_tokens"] + STUB_USAGE["cache_creation_input_tokens"]
    )
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (prompt, 100, 3)
    assert (record.cache_write_tokens, record.retention_class) == (30, "1h")
    assert set(record.applied_rules) == {"newlines", "tool_schema_key_order", "tool_order"}


def test_passthrough_stream_relays_events_and_records_usage(anthropic_gateway):
    gw, stub = anthropic_gateway
    with client(gw).messages.stream(
        model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert text == "Hi there"
    assert (message.usage.cache_read_input_tokens, message.usage.output_tokens) == (100, 3)
    (record,) = gw.wait_records(1)
    assert (record.stream, record.cached_tokens, record.cache_write_tokens, record.completion_tokens) == (
        True,
        100,
        30,
        3,
    )
    assert record.prompt_tokens == 137 and record.ttft_ms is not None


def test_passthrough_errors_and_count_tokens(anthropic_gateway):
    gw, stub = anthropic_gateway
    sdk = client(gw)
    with pytest.raises(anthropic.APIStatusError) as caught:
        sdk.messages.create(model="err-529", max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert caught.value.status_code == 529
    assert caught.value.body["error"] == {"type": "overloaded_error", "message": "stub is overloaded"}
    assert sdk.messages.count_tokens(model="claude-x", messages=[{"role": "user", "content": "Hi"}]).input_tokens == 137
    assert stub.state.paths[-1] == "/v1/messages/count_tokens"
    body = {"model": "claude-x", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    assert httpx.post(f"{gw.url}/v1/messages", json=body).status_code == 200
    assert stub.state.headers[-1]["anthropic-version"] == "2023-06-01"  # the default when the client sends none
    error_record, ok_record = gw.wait_records(2)
    assert (error_record.status_code, error_record.error_type) == (529, "overloaded_error")
    assert ok_record.status_code == 200
