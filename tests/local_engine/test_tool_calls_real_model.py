"""Tool calls from SmolLM2 over HTTP with the `openai` package: forced calls come back as `tool_calls`, plain and
streamed, and `tool_choice: "none"` leaves the answer as text."""

from __future__ import annotations

import json

import pytest
from openai import OpenAI

from .server_fixtures import served_engine

pytestmark = pytest.mark.real_model

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(smollm2_loaded):
    with served_engine(smollm2_loaded, kv_cache_tokens=8192) as (base_url, _):
        yield OpenAI(base_url=base_url + "/v1", api_key="not-needed", max_retries=0, timeout=120)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_is_returned_as_tool_calls(client, tool_choice):
    completion = client.chat.completions.create(
        model="smollm2", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice, temperature=0, max_tokens=128
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert "city" in json.loads(call.function.arguments)


def test_a_streamed_forced_call_arrives_as_delta_tool_calls(client):
    chunks = list(client.chat.completions.create(
        model="smollm2", messages=MESSAGES, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=128,
        stream=True,
    ))
    deltas = [tc for chunk in chunks for tc in (chunk.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.function.name) for d in deltas] == [(0, "get_weather")]
    assert "city" in json.loads(deltas[0].function.arguments)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_answers_in_text(client):
    completion = client.chat.completions.create(
        model="smollm2", messages=MESSAGES, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=12
    )
    assert completion.choices[0].message.tool_calls is None
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content
