"""The Responses API through the gateway to the real engine (SmolLM2-135M-Instruct on the CPU), driven by the official
`openai` package and the OpenAI Agents SDK (both its Responses and its Chat Completions models), recording into
SQLite. Every test starts its instructions with a fresh nonce so that nothing cached by another test can help it."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from gateway_testkit import db_storage, gateway_config, running_gateway
from real_engine_kit import MODEL, create_keys, stored

from gateway.config import UpstreamConfig

pytestmark = pytest.mark.real_model

INSTRUCTIONS = (
    "You are the support assistant of a bicycle shop. You answer questions about orders, repairs, spare parts "
    "and opening hours. Be brief, be friendly, and never invent order numbers or prices. "
) * 3
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@dataclass
class Deployment:
    url: str
    key: str
    database_url: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0, timeout=300)

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def deployment(engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp_path: Path = tmp_path_factory.mktemp("responses")
    database_url = f"sqlite:///{tmp_path}/gateway.db"
    tenant = f"responses-{uuid.uuid4().hex[:8]}"
    keys = create_keys(database_url, [tenant])
    config = gateway_config(
        engine_url,
        upstreams=(UpstreamConfig(name="engine", url=engine_url, kind="local_engine", timeout_s=300.0),),
        default_upstream="engine",
        auth="keys",
    )
    with running_gateway(config, db_storage(database_url, tmp_path)) as gw:
        yield Deployment(gw.url, keys[tenant], database_url)


def instructions() -> str:
    return f"[session {uuid.uuid4().hex}] {INSTRUCTIONS}"


def test_text_then_streamed_turn_reads_the_cached_instructions(deployment: Deployment):
    client = deployment.client()
    system = instructions()
    raw = client.responses.with_raw_response.create(
        model=MODEL, instructions=system, input="When are you open?", max_output_tokens=8, temperature=0
    )
    first = raw.parse()
    assert first.status in ("completed", "incomplete") and first.output_text
    assert first.usage.input_tokens_details.cached_tokens == 0  # a fresh nonce: nothing of it was cached
    prompt_tokens = first.usage.input_tokens
    with client.responses.stream(
        model=MODEL, instructions=system, input="Can you fix a flat tyre?", max_output_tokens=8, temperature=0
    ) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    # Cut at max_output_tokens the stream ends with `response.incomplete`, as OpenAI's does, else `completed`.
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in (
        "response.completed", "response.incomplete")
    second = events[-1].response
    assert second.status == kinds[-1].removeprefix("response.")
    assert "response.output_text.delta" in kinds and second.output_text
    # The second call reads the instructions the first one computed: all but the differing question.
    assert second.usage.input_tokens_details.cached_tokens >= prompt_tokens - 12
    rows = stored(deployment.database_url, "requests", "id", [raw.headers["x-request-id"]])
    (row,) = rows.values()
    assert (row["endpoint"], row["prompt_tokens"], row["cached_tokens"]) == ("responses", prompt_tokens, 0)


def test_function_call_then_its_output_continues_the_stored_conversation(deployment: Deployment):
    client = deployment.client()
    call_response = client.responses.create(
        model=MODEL,
        instructions=instructions(),
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_output_tokens=64,
        temperature=0,
    )
    calls = [item for item in call_response.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    answer = client.responses.create(
        model=MODEL,
        previous_response_id=call_response.id,
        instructions=call_response.instructions,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "It is 18 C and sunny."}],
        tools=[WEATHER_TOOL],
        max_output_tokens=12,
        temperature=0,
    )
    assert answer.previous_response_id == call_response.id and answer.output
    # The whole first turn (instructions, tools, question) was cached by the first call and read by the second.
    assert answer.usage.input_tokens_details.cached_tokens >= call_response.usage.input_tokens - 2


def test_openai_agents_sdk_runs_unchanged_on_both_of_its_models(deployment: Deployment):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # the SDK would export traces to OpenAI; nothing leaves this machine
    # The SDK treats a response cut at max_tokens as a failure (as it would OpenAI's): room for a whole short answer.
    settings = ModelSettings(max_tokens=64, temperature=0)

    async def run_both() -> list:
        client = deployment.async_client()
        results = []
        for model in (
            OpenAIResponsesModel(model=MODEL, openai_client=client),
            OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
        ):
            agent = Agent(
                name="Calculator",
                # A fixed prompt: greedy decoding then gives the same short answer on every run.
                instructions="You are a calculator. Answer with the number only.",
                model=model,
                model_settings=settings,
            )
            results.append(await Runner.run(agent, "What is 2+2?"))
        await client.close()
        return results

    results = asyncio.run(run_both())
    for result in results:
        assert isinstance(result.final_output, str) and "4" in result.final_output
        usage = result.context_wrapper.usage
        assert usage.requests == 1 and usage.input_tokens > 0 and usage.output_tokens > 0
    # Both models render the same prompt through the gateway, so greedy decoding answers the same.
    assert results[0].final_output == results[1].final_output
