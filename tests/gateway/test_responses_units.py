"""Pure parts of the Responses API and of provider diagnostics: the kept responses' bounds and tenant isolation,
translation both ways, the event writer, the Responses-shaped normalization, and reading providers' diagnoses."""

from __future__ import annotations

import json

import pytest

from gateway.errors import BadRequest
from gateway.provider_diagnostics import Baselines, ProviderDiagnosis, from_anthropic, from_openai
from gateway.responses.engine_forward import responses_error
from gateway.responses.normalize import normalize
from gateway.responses.request import parse_responses_request
from gateway.config.responses import ResponsesSettings
from gateway.responses.store import ResponseStore, StoredResponse
from gateway.responses.stream import EventWriter
from gateway.responses.translate import history_messages, input_messages, output_items, response_format, to_chat_body
from gateway.config.tenant import TenantSettings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tenant_key(tenant: str) -> bytes:
    return tenant.encode().ljust(16, b"\0")


def kept(tenant: str, text: str = "x") -> StoredResponse:
    return StoredResponse(tenant, "engine", {"id": "r", "output": []}, [{"role": "user", "content": text}])


def test_a_kept_response_is_its_tenants_only_and_expires_after_its_last_use():
    clock = Clock()
    store = ResponseStore(ResponsesSettings(store_ttl_s=60), tenant_key, clock)
    store.put("acme", "resp_1", kept("acme"))
    assert store.get("beta", "resp_1") is None and not store.delete("beta", "resp_1")
    clock.now += 50
    assert store.get("acme", "resp_1") is not None  # used: its lifetime starts again
    clock.now += 50
    assert store.get("acme", "resp_1") is not None
    clock.now += 61
    assert store.get("acme", "resp_1") is None and len(store) == 0 and store.size_bytes == 0


def test_bounds_per_tenant_in_all_and_in_bytes_push_out_the_least_recently_used():
    store = ResponseStore(ResponsesSettings(store_max_entries=4, store_max_entries_per_tenant=2), tenant_key, Clock())
    store.put("beta", "b1", kept("beta"))
    for index in range(3):
        store.put("acme", f"a{index}", kept("acme"))
    # acme's third response pushed out acme's oldest, not beta's.
    assert store.get("acme", "a0") is None and store.get("beta", "b1") is not None
    assert store.get("acme", "a1") is not None and store.get("acme", "a2") is not None
    store.put("gamma", "g1", kept("gamma"))
    store.put("gamma", "g2", kept("gamma"))
    # In all at most 4: beta's response, read before acme's two, was the least recently used.
    assert len(store) == 4 and store.get("beta", "b1") is None and store.get("acme", "a1") is not None
    small = ResponseStore(ResponsesSettings(store_max_bytes=2000), tenant_key, Clock())
    for index in range(10):
        small.put("acme", f"r{index}", kept("acme", "y" * 500))
    assert small.size_bytes <= 2000 and small.get("acme", "r9") is not None and small.get("acme", "r0") is None


def test_input_items_become_chat_messages():
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in "},
                                                        {"type": "input_text", "text": "Paris?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
    ]
    messages = input_messages(items)
    assert messages[:2] == [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    assert messages[2]["content"] == "Checking." and [c["id"] for c in messages[2]["tool_calls"]] == ["c1", "c2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "18 C"}
    with pytest.raises(BadRequest) as refused:
        input_messages([{"type": "item_reference", "id": "x"}])
    assert refused.value.param == "input[0].type"


def test_output_items_round_trip_into_the_next_turns_history():
    message = {"content": "Let me check.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]}
    output = output_items(message)
    assert [item["type"] for item in output] == ["message", "function_call"]
    assert output[1]["call_id"] == "c1"
    assert history_messages(output) == [{"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]}]


def test_function_tools_are_strict_unless_the_client_opts_out():
    """As on OpenAI's Responses API, a function tool sent without `strict` has its schema enforced."""
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    tools = [{"type": "function", "name": "weather", "parameters": parameters},
             {"type": "function", "name": "time", "parameters": parameters, "strict": False},
             {"type": "function", "name": "date", "parameters": parameters, "strict": True}]
    chat = to_chat_body({"model": "m", "input": "hi", "tools": tools}, [], stream=False)
    assert [tool["function"].get("strict") for tool in chat["tools"]] == [True, None, True]


def test_text_format_and_prompt_cache_retention():
    assert response_format({"format": {"type": "text"}}) is None
    schema = {"type": "object"}
    assert response_format({"format": {"type": "json_schema", "name": "n", "schema": schema}}) == {
        "type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    with pytest.raises(BadRequest):
        response_format({"format": {"type": "json_schema", "schema": schema}})  # no name
    body = {"model": "m", "input": "hi", "prompt_cache_retention": "24h"}
    assert parse_responses_request(json.dumps(body).encode()).retention_class == "persistent"
    body["cache_retention"] = "5m"  # the gateway's own field wins
    assert parse_responses_request(json.dumps(body).encode()).retention_class == "5m"


def test_an_upstream_error_names_the_responses_field():
    refused = {"error": {"message": "response_format json_schema is not supported", "type": "invalid_request_error",
                         "param": "response_format.json_schema", "code": None}}
    renamed = json.loads(responses_error(json.dumps(refused).encode()))
    assert renamed["error"]["param"] == "text.format.json_schema"
    assert renamed["error"]["message"] == "text.format json_schema is not supported"
    # The message names the Responses field too, whatever the param (the engine's range check, say).
    for chat_message, responses_message, param in [
        ("max_tokens must be an integer in [1, 2147483647]", "max_output_tokens must be an integer in [1, 2147483647]",
         "max_output_tokens"),
        ("response_format={'type': 'json_object'} is not supported by this engine",
         "text.format={'type': 'json_object'} is not supported by this engine", "text.format"),
        ("prompt and max_tokens exceed the context (max_tokens_x kept)",
         "prompt and max_output_tokens exceed the context (max_tokens_x kept)", None),
    ]:
        param_in = {"max_output_tokens": "max_tokens", "text.format": "response_format", None: None}[param]
        error = {"error": {"message": chat_message, "type": "invalid_request_error", "param": param_in, "code": None}}
        renamed = json.loads(responses_error(json.dumps(error).encode()))["error"]
        assert (renamed["message"], renamed["param"]) == (responses_message, param)
    other = json.dumps({"error": {"message": "no", "param": "temperature"}}).encode()
    assert responses_error(other) == other and responses_error(b"not json") == b"not json"


def test_event_writer_numbers_events_and_closes_each_item():
    writer = EventWriter(lambda status, output, usage, reason=None: {"status": status, "output": output})
    out = writer.start()
    out += writer.feed({"choices": [{"delta": {"content": "Hi"}}]})
    call = {"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}
    out += writer.feed({"choices": [{"delta": {"tool_calls": [call]}, "finish_reason": "tool_calls"}]})
    closing, final = writer.finish("completed", {}, None)
    events = [json.loads(line[6:]) for line in (out + closing).decode().splitlines() if line.startswith("data: ")]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    done = [event for event in events if event["type"] == "response.output_item.done"]
    assert [(event["output_index"], event["item"]["type"]) for event in done] == [(0, "message"), (1, "function_call")]
    assert [item["status"] for item in final["output"]] == ["completed", "completed"]
    assert final["output"][0]["content"][0]["text"] == "Hi" and final["output"][1]["arguments"] == "{}"


def test_the_item_cut_at_max_output_tokens_is_incomplete_streamed_or_not():
    """An agent must never run a call the limit cut short: that item (the last) is `incomplete`, the others not."""
    call = {"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"city": "Pa'}}
    writer = EventWriter(lambda status, output, usage, reason=None: {"status": status, "output": output})
    writer.start()
    writer.feed({"choices": [{"delta": {"content": "Let me check."}}]})
    writer.feed({"choices": [{"delta": {"tool_calls": [call]}, "finish_reason": "length"}]})
    _, final = writer.finish("incomplete", {}, "max_output_tokens")
    assert [item["status"] for item in final["output"]] == ["completed", "incomplete"]
    message = {"content": "Let me check.", "tool_calls": [{"id": "c1", "type": "function", "function": call["function"]}]}
    assert [item["status"] for item in output_items(message, "incomplete")] == ["completed", "incomplete"]
    assert [item["status"] for item in output_items(message)] == ["completed", "completed"]


def test_responses_shaped_normalization_uses_the_tenants_rules():
    body = {
        "model": "m",
        "instructions": "Line one\r\nLine two",
        "tools": [{"type": "function", "name": "zeta", "parameters": {"type": "object", "properties": {}}},
                  {"type": "function", "name": "alpha", "parameters": {"properties": {}, "type": "object"}}],
        "input": [{"type": "function_call", "call_id": "c", "name": "zeta", "arguments": '{"b": 1, "a": 2}'},
                  {"role": "assistant", "content": [{"type": "output_text", "text": "Done.\r\n"}]}],
    }
    normalized, applied = normalize(body, TenantSettings())
    assert applied == ("newlines", "tool_schema_key_order", "tool_order")
    assert normalized["instructions"] == "Line one\nLine two"
    assert [tool["name"] for tool in normalized["tools"]] == ["alpha", "zeta"]
    assert list(normalized["tools"][0]["parameters"]) == ["properties", "type"]
    # The answers re-sent are what the upstream cached: a function call's arguments and an assistant's text as sent.
    assert normalized["input"] == body["input"]
    assert body["instructions"] == "Line one\r\nLine two"  # the input is not mutated
    assert normalize(normalized, TenantSettings()) == (normalized, ())
    assert normalize(body, TenantSettings(rules=frozenset()))[1] == ()


def test_reading_providers_diagnoses():
    miss = {"type": "cache_miss", "reason": "tools_changed", "cache_missed_tokens": 900, "comparison_reusable_tokens": 3}
    assert from_openai(miss) == ProviderDiagnosis("tools_changed", 900)
    assert from_openai({"type": "cache_hit"}) == ProviderDiagnosis("cache_hit")
    assert from_openai({"type": "comparison_response_not_found"}) == ProviderDiagnosis("comparison_response_not_found")
    assert from_openai(None) is None and from_openai({"reason": "x"}) is None
    reason = {"type": "messages_changed", "cache_missed_input_tokens": 77}
    assert from_anthropic({"diagnostics": {"cache_miss_reason": reason}}, True) == ProviderDiagnosis(
        "messages_changed", 77)
    assert from_anthropic({"diagnostics": None}, True) == ProviderDiagnosis("no_divergence")
    assert from_anthropic({"diagnostics": None}, False) is None
    assert from_anthropic({"diagnostics": {"cache_miss_reason": None}}, True) == ProviderDiagnosis("pending")
    assert from_anthropic({"id": "msg_1"}, True) is None  # an answer without the key says nothing


def test_baselines_are_per_tenant_upstream_and_prefix_and_expire():
    clock = Clock()
    baselines = Baselines(max_entries=2, ttl_s=60, clock=clock)
    baselines.update("acme", "openai", "p1", "resp_1")
    assert baselines.latest("acme", "openai", "p1") == "resp_1"
    assert baselines.latest("beta", "openai", "p1") is None
    assert baselines.latest("acme", "other", "p1") is None and baselines.latest("acme", "openai", "p2") is None
    clock.now += 61
    assert baselines.latest("acme", "openai", "p1") is None
    for index in range(3):
        baselines.update("acme", "openai", f"q{index}", f"r{index}")
    assert baselines.latest("acme", "openai", "q0") is None and baselines.latest("acme", "openai", "q2") == "r2"
