"""A tool-calling loop (call -> tool result -> final answer) with the official `openai` package, through the
gateway, against the real engine; the stored rows keep their miss explanation and normalization."""

from __future__ import annotations

import json

import openai
import pytest
from gateway_testkit import db_storage, gateway_config, running_gateway
from real_engine_kit import MODEL, create_keys, stored

from db.records import MISS_REASONS
from gateway.config import UpstreamConfig

pytestmark = pytest.mark.real_model

# Keys deliberately out of order: the gateway's tool_schema_key_order rule sorts them.
TOOLS = [{
    "type": "function",
    "function": {
        "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}},
        "name": "get_weather",
        "description": "Get the current weather in a city",
    },
}]


def get_weather(city: object) -> str:
    return f"It is 18 C and sunny in {city}."


def test_tool_calling_loop_through_the_gateway(engine_url, tmp_path):
    database_url = f"sqlite:///{tmp_path}/gateway.db"
    keys = create_keys(database_url, ["agent"])
    config = gateway_config(
        engine_url, upstreams=(UpstreamConfig(name="engine", url=engine_url, kind="local_engine", timeout_s=300.0),),
        default_upstream="engine",
        auth="keys",
    )
    with running_gateway(config, db_storage(database_url, tmp_path)) as gw:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=keys["agent"], max_retries=0, timeout=300)
        messages = [
            # A fixed prompt: greedy decoding then gives the same call on every run.
            {"role": "system", "content": "Session 5c1e. You can look up the weather."},
            {"role": "user", "content": "What is the weather in Paris?"},
        ]
        first = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=128
        )
        call_completion = first.parse()
        choice = call_completion.choices[0]
        # The forced call opens the string-typed `city` for the model and ends where its JSON closes.
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather"
        arguments = json.loads(call.function.arguments)
        assert isinstance(arguments["city"], str) and arguments["city"]
        messages.append(choice.message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": get_weather(arguments.get("city"))})

        second = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=16
        )
        final = second.parse().choices[0]
        assert final.message.tool_calls is None
        assert final.finish_reason in ("stop", "length")
        assert isinstance(final.message.content, str) and final.message.content
        assert second.parse().usage.prompt_tokens_details.cached_tokens > 0

        # The same call streamed through the gateway: one `delta.tool_calls` entry, then finish_reason tool_calls.
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=messages[:2], tools=TOOLS, temperature=0, max_tokens=128, stream=True,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        ))
        deltas = [tc for chunk in chunks if chunk.choices for tc in (chunk.choices[0].delta.tool_calls or [])]
        assert [(d.index, d.type, d.function.name) for d in deltas] == [(0, "function", "get_weather")]
        assert json.loads(deltas[0].function.arguments) == arguments
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
        assert all(c.usage is None for c in chunks)

        ids = [first.headers["x-request-id"], second.headers["x-request-id"]]
        rows = stored(database_url, "requests", "id", ids)
    first_row, second_row = rows[ids[0]], rows[ids[1]]
    assert (first_row["status_code"], second_row["status_code"]) == (200, 200)
    for row in (first_row, second_row):
        rules = json.loads(row["applied_rules"]) if isinstance(row["applied_rules"], str) else row["applied_rules"]
        assert "tool_schema_key_order" in rules
    # The conversation with a tool call and its result is still explained against the first request.
    assert second_row["miss_reason"] in MISS_REASONS
    assert second_row["cached_tokens"] > 0
