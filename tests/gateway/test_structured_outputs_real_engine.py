"""Clients no one here wrote, unchanged, through the gateway to the real engine: the `openai` package's
`chat.completions.parse`, LangChain's `with_structured_output` and `instructor` get typed objects back (the gateway
passes `response_format` through); `n=4` computes its prompt once on the engine; logprobs come through; strict
function tools' calls match their schemas; the Responses API's `text.format` gives JSON matching its schema."""

from __future__ import annotations

import json
import re

import httpx
import instructor
import jsonschema
import openai
import pytest
from gateway_testkit import gateway_config, running_gateway
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict
from real_engine_kit import MODEL

from gateway.config import UpstreamConfig

pytestmark = pytest.mark.real_model


class Shipment(BaseModel):
    # No keys beyond these (`additionalProperties: false`): without it the schema admits any other key, and the
    # constrained answer may spend its max_tokens on keys the model invents.
    model_config = ConfigDict(extra="forbid")

    city: str
    delivered: bool
    days: int


QUESTION = "A parcel shipped to Lyon arrived after 4 days. Describe the shipment as JSON."


@pytest.fixture(scope="module")
def gateway(engine_url):
    upstream = UpstreamConfig(name="engine", url=engine_url, kind="local_engine", timeout_s=300.0)
    with running_gateway(gateway_config(engine_url, upstreams=(upstream,), default_upstream="engine")) as gw:
        yield gw


@pytest.fixture(scope="module")
def client(gateway):
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_openai_parse_returns_a_parsed_object(client):
    completion = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], response_format=Shipment, max_tokens=48,
        temperature=0,
    )
    assert isinstance(completion.choices[0].message.parsed, Shipment)


def test_langchain_with_structured_output(gateway):
    llm = ChatOpenAI(model=MODEL, base_url=f"{gateway.url}/v1", api_key="unused", temperature=0, max_tokens=48,
                     max_retries=0, timeout=300)
    answer = llm.with_structured_output(Shipment).invoke(QUESTION)
    assert isinstance(answer, Shipment)


def test_instructor_with_a_response_model(client):
    patched = instructor.from_openai(client, mode=instructor.Mode.JSON_SCHEMA)
    answer = patched.chat.completions.create(
        model=MODEL, response_model=Shipment, messages=[{"role": "user", "content": QUESTION}], max_tokens=48,
        temperature=0, max_retries=0,
    )
    assert isinstance(answer, Shipment)


def prefill_tokens(engine_url: str) -> float:
    metrics = httpx.get(f"{engine_url}/metrics", timeout=30).text
    return float(re.search(r"^prefixscope_engine_prefill_tokens(?:_total)? (\S+)$", metrics, re.M).group(1))


def test_n4_computes_the_prompt_once_and_logprobs_pass_through(client, engine_url):
    before = prefill_tokens(engine_url)
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name four fruits."}], n=4, max_tokens=6,
        temperature=1.0, seed=9, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True},
    )
    assert [choice.index for choice in answer.choices] == [0, 1, 2, 3]
    uncached = answer.usage.prompt_tokens - answer.usage.prompt_tokens_details.cached_tokens
    assert uncached > 0 and prefill_tokens(engine_url) - before == uncached  # once, not four times
    assert answer.usage.completion_tokens == 24
    assert all(len(choice.logprobs.content) == 6 for choice in answer.choices)


SHIPMENT_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}, "delivered": {"type": "boolean"},
                   "days": {"type": "integer", "minimum": 0, "maximum": 365}},
    "required": ["city", "delivered", "days"],
    "additionalProperties": False,
}
STRICT_TOOLS = [
    {"type": "function", "function": {
        "name": "record_shipment", "description": "Record a shipment", "strict": True, "parameters": SHIPMENT_SCHEMA}},
    {"type": "function", "function": {
        "name": "convert_temperature", "description": "Convert a temperature", "strict": True, "parameters": {
            "type": "object",
            "properties": {"value": {"type": "number"}, "to": {"enum": ["celsius", "fahrenheit", "kelvin"]}},
            "required": ["value", "to"], "additionalProperties": False}}},
]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in STRICT_TOOLS}
TOOL_PROMPTS = [
    QUESTION,
    "Convert 21.5 degrees Celsius to Fahrenheit.",
    "Hello! What can you do for me today?",  # a prompt that asks for no tool at all: the call is forced anyway
]


@pytest.mark.parametrize("tool_choice", [
    {"type": "function", "function": {"name": "record_shipment"}},
    {"type": "function", "function": {"name": "convert_temperature"}},
    "required",
], ids=["named-shipment", "named-temperature", "required"])
def test_strict_tool_calls_match_their_schemas(client, tool_choice):
    for prompt in TOOL_PROMPTS:
        completion = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], tools=STRICT_TOOLS, tool_choice=tool_choice,
            max_tokens=96, temperature=0,
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        (call,) = choice.message.tool_calls
        if isinstance(tool_choice, dict):
            assert call.function.name == tool_choice["function"]["name"]
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_a_streamed_strict_tool_call_matches_its_schema(client):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], tools=STRICT_TOOLS, tool_choice="required",
        max_tokens=96, temperature=0.8, seed=3, stream=True,
    ))
    deltas = [tc for chunk in chunks if chunk.choices for tc in (chunk.choices[0].delta.tool_calls or [])]
    assert len(deltas) == 1 and [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    jsonschema.validate(json.loads(deltas[0].function.arguments), SCHEMAS[deltas[0].function.name])


def test_a_strict_schema_that_does_not_compile_is_a_400_naming_the_tool(client):
    # Named to sort last: the gateway's tool_order rule forwards the tools sorted by name, and the index is theirs.
    broken = {"type": "function", "function": {"name": "zz_broken", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"type": "no-such-type"}}}}}
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                       tools=[*STRICT_TOOLS, broken], max_tokens=4)
    assert raised.value.body["param"] == "tools[2].function.parameters"


def test_responses_text_format_json_schema_validates(client):
    for prompt in (QUESTION, "A box sent to Kyoto has not arrived yet; it left 12 days ago. Describe it as JSON."):
        response = client.responses.create(
            model=MODEL, input=prompt, max_output_tokens=64, temperature=0,
            text={"format": {"type": "json_schema", "name": "shipment", "schema": SHIPMENT_SCHEMA, "strict": True}},
        )
        jsonschema.validate(json.loads(response.output_text), SHIPMENT_SCHEMA)


def test_responses_parse_returns_a_parsed_object(client):
    response = client.responses.parse(model=MODEL, input=QUESTION, text_format=Shipment, max_output_tokens=64,
                                      temperature=0)
    assert isinstance(response.output_parsed, Shipment)
