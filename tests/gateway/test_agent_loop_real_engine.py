"""Agent tool loops through the gateway (default normalization rules) in front of the real engine (SmolLM2 on the CPU),
recording into SQLite, driven by the official `openai` package and by the OpenAI Agents SDK (its Chat Completions
and its Responses models): five turns, each re-sending every earlier answer exactly as the gateway returned it, tool
calls included. Every turn after the first is served from the cache up to what it adds (its ledger holds only
`new` and `page_alignment` tokens), and no row blames the client for a rewritten answer.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import openai
import pytest
from real_engine_kit import MODEL, keyed_gateway

from db.ledger import TokenLedger
from gateway.config import TenantSettings

pytestmark = pytest.mark.real_model

TURNS = 5
DEFAULTS = TenantSettings(uplift_sample_rate=0.0, advice_sample_rate=0.0)  # the default rules, no sampled extras
TENANTS = ("sdk", "agents_chat", "agents_responses")
# Keys out of order, so that `tool_schema_key_order` has work to do on every turn.
PARAMETERS = {"type": "object", "required": ["city"], "properties": {"unit": {"type": "string"}, "city": {
    "type": "string"}}}


@dataclass
class Deployment:
    url: str
    keys: dict[str, str]
    database_url: str

    def client(self, tenant: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.keys[tenant], max_retries=0, timeout=300)

    def async_client(self, tenant: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=self.keys[tenant], max_retries=0, timeout=300)

    def rows(self, tenant: str, count: int) -> list[dict[str, Any]]:
        """The tenant's stored rows in the order they were sent (`count` of them, once all are there)."""
        from sqlalchemy import create_engine, text

        from gateway_testkit import wait_until

        engine = create_engine(self.database_url)
        query = text("SELECT * FROM requests WHERE tenant = :tenant ORDER BY created_at, turn_index")
        try:
            def fetch() -> list[dict[str, Any]]:
                with engine.connect() as conn:
                    return [dict(row._mapping) for row in conn.execute(query, {"tenant": tenant})]

            wait_until(lambda: len(fetch()) >= count)
            return fetch()
        finally:
            engine.dispose()


@pytest.fixture(scope="module")
def deployment(engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tenants = dict.fromkeys(TENANTS, DEFAULTS)
    with keyed_gateway(engine_url, tmp_path_factory.mktemp("agent-loop"), tenants) as (url, keys, database_url):
        yield Deployment(url, keys, database_url)


def weather(city: object, turn: int) -> str:
    return f"Turn {turn}: it is {12 + turn} C and sunny in {city}."


def assert_each_turn_served_from_cache(rows: list[dict[str, Any]]) -> None:
    """Five turns of one conversation, each after the first reusing all its parent computed, answer included."""
    assert [row["turn_index"] for row in rows] == list(range(1, TURNS + 1)), rows
    assert len({row["conversation_id"] for row in rows}) == 1
    for parent, row in zip(rows, rows[1:]):
        assert row["parent_request_id"] == parent["id"]
        assert "tool_call_arguments_key_order" not in json.loads(row["applied_rules"])  # the answers left alone
        ledger = TokenLedger.of(SimpleNamespace(**row))
        assert ledger is not None and ledger.adds_up(), row
        assert set(ledger.lost) <= {"page_alignment"}, (row["miss_reason"], ledger)
        # The parent's prompt and the answer it generated (less its last token, never fed back, and the tokens
        # where the engine's own tokens of its answer are not those of the same text encoded again).
        assert row["cached_tokens"] >= parent["prompt_tokens"] + parent["completion_tokens"] - 3, (parent, row)
    for row in rows:
        assert row["answer_rewrite"] is None and row["miss_reason"] != "answer_rewritten", row
        assert not row["lost_answer_rewritten_tokens"]


def test_an_openai_sdk_tool_loop_resends_each_answer_from_the_cache(deployment: Deployment):
    client = deployment.client("sdk")
    tools = [{"type": "function", "function": {"parameters": PARAMETERS, "name": "get_weather",
                                               "description": "Get the current weather in a city."}}]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"Session {uuid.uuid4().hex[:8]}. You look up the weather for the user."},
        {"role": "user", "content": "What is the weather in Paris, and then in Lyon?"},
    ]
    for turn in range(1, TURNS + 1):
        completion = client.chat.completions.create(
            model=MODEL, messages=messages, tools=tools, tool_choice="required", temperature=0, max_tokens=48
        )
        message = completion.choices[0].message
        (call,) = message.tool_calls
        # Re-sent as the SDK gives it back: the very text of the arguments the gateway returned.
        messages.append(message.model_dump(exclude_none=True))
        city = json.loads(call.function.arguments).get("city")
        messages.append({"role": "tool", "tool_call_id": call.id, "content": weather(city, turn)})
    assert_each_turn_served_from_cache(deployment.rows("sdk", TURNS))


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_an_openai_agents_sdk_tool_loop_resends_each_answer_from_the_cache(deployment: Deployment, api: str):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        ToolsToFinalOutputResult,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # the SDK would export traces to OpenAI; nothing leaves this machine
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return weather(city, len(calls))

    def stop_after_the_last_turn(_context: Any, results: list[Any]) -> ToolsToFinalOutputResult:
        # Each model call is one turn: the loop ends with the tool result of the last one.
        return ToolsToFinalOutputResult(is_final_output=len(calls) >= TURNS, final_output=results[-1].output)

    tenant = f"agents_{api}"

    async def run() -> Any:
        client = deployment.async_client(tenant)
        model_class = OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel
        agent = Agent(
            name="Weather",
            instructions=f"Session {uuid.uuid4().hex[:8]}. You look up the weather for the user.",
            model=model_class(model=MODEL, openai_client=client),
            # A small model does not call tools on its own: every turn is a forced call, kept forced.
            model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=48),
            tools=[get_weather],
            reset_tool_choice=False,
            tool_use_behavior=stop_after_the_last_turn,
        )
        try:
            return await Runner.run(agent, "What is the weather in Paris, and then in Lyon?", max_turns=TURNS + 1)
        finally:
            await client.close()

    result = asyncio.run(run())
    assert len(calls) == TURNS and result.context_wrapper.usage.requests == TURNS
    assert_each_turn_served_from_cache(deployment.rows(tenant, TURNS))
