"""The Responses API through the gateway to a chat upstream (the stub, shaped like the local engine), driven by the
official `openai` package: what the upstream is sent, what the client gets back, streamed event by event, the kept
conversation of `previous_response_id` (per tenant), `GET`/`DELETE`, and the record."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from gateway_testkit import TEST_SECRET, FakeStorage, RunningGateway, gateway_config, running_gateway
from stub_upstream import STUB_TOOL_CALL

from gateway.config import UpstreamConfig
from gateway.tenancy import derive_salt
from gateway.upstreams.prompt_cache_key import derive_prompt_cache_key

STREAM_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


@pytest.fixture
def keyed_gateway(stub, stub_url) -> Iterator[tuple[RunningGateway, dict[str, str]]]:
    storage = FakeStorage()
    keys = {tenant: storage.add_key(f"k-{tenant}", tenant) for tenant in ("acme", "beta")}
    with running_gateway(gateway_config(stub_url, auth="keys"), storage) as gw:
        yield gw, keys


def client(gw: RunningGateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0, timeout=30)


def test_text_input_becomes_a_chat_request_and_the_answer_a_response(stub, keyed_gateway):
    gw, keys = keyed_gateway
    response = client(gw, keys["acme"]).responses.create(
        model="m", instructions="Be brief.", input="Hi there", max_output_tokens=16, temperature=0.0
    )
    assert response.output_text == "ok"
    assert response.status == "completed" and response.id.startswith("resp_")
    assert response.usage.input_tokens == 10
    assert response.usage.input_tokens_details.cached_tokens == 4
    assert response.usage.output_tokens == 2
    sent = stub.state.requests[-1]
    assert stub.state.paths[-1] == "/v1/chat/completions"
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert sent["max_tokens"] == 16 and sent["temperature"] == 0.0
    assert sent["cache_salt"]  # the tenant's salt, as on every endpoint
    (record,) = gw.wait_records(1)
    assert record.endpoint == "responses" and record.tenant == "acme"
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (10, 4, 2)
    assert record.prefix_hash is not None  # the instructions are the prefix


def test_streamed_response_follows_the_responses_event_sequence(stub, keyed_gateway):
    gw, keys = keyed_gateway
    with client(gw, keys["acme"]).responses.stream(model="m", input="Hi") as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert [event.type for event in events] == STREAM_EVENTS
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello world"
    assert final.output_text == "Hello world"
    assert final.usage.input_tokens_details.cached_tokens == 4
    (record,) = gw.wait_records(1)
    assert record.endpoint == "responses" and record.stream and record.ttft_ms is not None


@pytest.mark.parametrize("stream", [False, True])
def test_function_tools_and_calls(stub, keyed_gateway, stream):
    gw, keys = keyed_gateway
    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            "strict": None,
        }
    ]
    api = client(gw, keys["acme"])
    if stream:
        with api.responses.stream(model="tool-calls", input="Weather in Paris?", tools=tools) as events:
            kinds = [event.type for event in events]
            response = events.get_final_response()
        assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    else:
        response = api.responses.create(model="tool-calls", input="Weather in Paris?", tools=tools, tool_choice="auto")
    calls = [item for item in response.output if item.type == "function_call"]
    assert [(c.call_id, c.name, c.arguments) for c in calls] == [
        (STUB_TOOL_CALL["id"], STUB_TOOL_CALL["name"], STUB_TOOL_CALL["arguments"])
    ]
    sent = stub.state.requests[-1]
    assert sent["tools"][0]["type"] == "function" and sent["tools"][0]["function"]["name"] == "get_weather"
    # The function's output goes back as a tool message after the call, continuing the stored conversation.
    api.responses.create(
        model="m",
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C and sunny"}],
    )
    messages = stub.state.requests[-1]["messages"]
    assert messages[0] == {"role": "user", "content": "Weather in Paris?"}
    assert messages[1]["role"] == "assistant" and messages[1]["tool_calls"][0]["id"] == STUB_TOOL_CALL["id"]
    assert messages[2] == {"role": "tool", "tool_call_id": STUB_TOOL_CALL["id"], "content": "18 C and sunny"}


def test_previous_response_id_is_the_tenants_own(stub, keyed_gateway):
    gw, keys = keyed_gateway
    acme, beta = client(gw, keys["acme"]), client(gw, keys["beta"])
    first = acme.responses.create(model="m", instructions="Be brief.", input="My name is Ada.")
    second = acme.responses.create(
        model="m", instructions="Be terse.", input="What is my name?", previous_response_id=first.id
    )
    # The earlier turn (input and output) follows the new instructions; the old instructions are not inherited.
    assert stub.state.requests[-1]["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "What is my name?"},
    ]
    assert second.previous_response_id == first.id
    sent = len(stub.state.requests)
    with pytest.raises(openai.NotFoundError) as refused:
        beta.responses.create(model="m", input="And mine?", previous_response_id=first.id)
    assert refused.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        beta.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        beta.responses.delete(first.id)
    assert len(stub.state.requests) == sent  # nothing of acme's reached the upstream for beta
    assert acme.responses.retrieve(first.id).output_text == "ok"
    acme.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        acme.responses.retrieve(first.id)
    # A response created with store=false is not kept.
    unkept = acme.responses.create(model="m", input="Forget me.", store=False)
    with pytest.raises(openai.NotFoundError):
        acme.responses.retrieve(unkept.id)


def test_text_format_json_schema_becomes_response_format(stub, keyed_gateway):
    gw, keys = keyed_gateway
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    client(gw, keys["acme"]).responses.create(
        model="m",
        input="Name a city.",
        text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}},
    )
    assert stub.state.requests[-1]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "city", "schema": schema, "strict": True},
    }
    client(gw, keys["acme"]).responses.create(model="m", input="JSON please.", text={"format": {"type": "json_object"}})
    assert stub.state.requests[-1]["response_format"] == {"type": "json_object"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "hi", "previous_response_id": "resp_unknown"}, "previous_response_id"),
        ({"input": "hi", "prompt_cache_retention": "forever"}, "prompt_cache_retention"),
        ({"input": "hi", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"input": "hi", "background": True}, "background"),
        ({}, "input"),
    ],
)
def test_what_a_chat_upstream_cannot_do_is_refused_naming_the_field(stub, keyed_gateway, body, param):
    gw, keys = keyed_gateway
    response = httpx.post(
        f"{gw.url}/v1/responses", json={"model": "m", **body}, headers={"authorization": f"Bearer {keys['acme']}"}
    )
    assert response.status_code in (400, 404)
    assert response.json()["error"]["param"] == param
    assert stub.state.requests == []
    (record,) = gw.wait_records(1)
    assert record.endpoint == "responses" and record.status_code == response.status_code


def test_chat_requests_to_openai_upstreams_carry_the_derived_prompt_cache_key(stub, stub_url):
    storage = FakeStorage()
    keys = {tenant: storage.add_key(f"k-{tenant}", tenant) for tenant in ("acme", "beta")}
    upstreams = (UpstreamConfig(name="openai", url=stub_url, kind="openai", timeout_s=30.0),)
    config = gateway_config(stub_url, auth="keys", upstreams=upstreams, default_upstream="openai")
    system = {"role": "system", "content": "You are the support assistant of a bicycle shop."}
    with running_gateway(config, storage) as gw:
        for tenant, question in (("acme", "When are you open?"), ("acme", "Any spare tubes?"), ("beta", "Hi")):
            client(gw, keys[tenant]).chat.completions.create(
                model="m", messages=[system, {"role": "user", "content": question}], prompt_cache_key="mine"
            )
    acme_first, acme_second, beta = (sent["prompt_cache_key"] for sent in stub.state.requests)
    assert acme_first == acme_second != beta  # one key per tenant and prefix, whatever follows the prefix
    body = {"model": "m", "messages": [system], "prompt_cache_key": "mine"}
    assert acme_first == derive_prompt_cache_key(derive_salt(TEST_SECRET, "acme"), body)
    assert all("cache_salt" not in sent for sent in stub.state.requests)
