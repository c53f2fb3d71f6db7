"""Strict function tools: the grammar of the model's tool calls with schema-checked arguments, its set-up from a
request, and forced calls sampled from a tiny random model that still match their schemas."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import llguidance
import llguidance.hf
import pytest

from local_engine.api.protocol import CHAT, parse_request
from local_engine.engine.tool_call_grammar import argument_schemas, tool_call_grammar
from local_engine.engine.types import GenerationRequest
from local_engine.errors import InvalidRequest
from local_engine.prompt.tool_calls import ToolCallStream
from local_engine.prompt.tool_calls.hermes import HermesFormat

from .conftest import run_to_end

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
                   "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}
DICE = {"type": "object", "properties": {"sides": {"type": "integer"}}, "required": ["sides"],
        "additionalProperties": False}


def tool(name: str, parameters: dict | None, strict: bool = True) -> dict:
    function = {"name": name, "strict": strict}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


TOOLS = [tool("get_weather", WEATHER), tool("roll_dice", DICE), tool("free_form", {"type": "object"}, strict=False)]


@pytest.fixture(scope="module")
def ll_tokenizer(smollm2_tokenizer):
    return llguidance.hf.from_tokenizer(smollm2_tokenizer)


def accepts(ll_tokenizer, tokenizer, grammar: str, text: str) -> bool:
    """Whether `text` is a whole output the grammar allows."""
    matcher = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    return matcher.validate_tokens(token_ids) == len(token_ids) and (matcher.consume_tokens(token_ids)
                                                                    and matcher.is_accepting())


def call(name: str, arguments: dict) -> str:
    return '<tool_call>{"name": "' + name + '", "arguments": ' + json.dumps(arguments) + "}</tool_call>"


def test_auto_allows_text_or_calls_whose_arguments_match(ll_tokenizer, smollm2_tokenizer):
    fmt = HermesFormat()
    names = ("get_weather", "roll_dice", "free_form")
    grammar = tool_call_grammar(fmt, names, argument_schemas(TOOLS), "")
    good = {"city": "Oslo", "days": 3, "unit": "celsius"}
    allowed = [
        "It is sunny in Oslo today.",
        "Let me look. " + call("get_weather", good),
        call("roll_dice", {"sides": 6}) + "\n" + call("free_form", {"anything": [1, "two"]}),
    ]
    refused = [
        call("get_weather", {"city": "Oslo", "days": 9, "unit": "celsius"}),  # above the maximum
        call("get_weather", {"city": "Oslo", "days": 3}),  # a required argument missing
        call("get_weather", {**good, "extra": 1}),  # additionalProperties: false
        call("roll_dice", {"sides": "six"}),
        call("send_mail", {}),  # no such tool
        call("roll_dice", {"sides": 6}) + " and some text after the call",
    ]
    assert [accepts(ll_tokenizer, smollm2_tokenizer, grammar, text) for text in allowed] == [True] * 3
    assert [accepts(ll_tokenizer, smollm2_tokenizer, grammar, text) for text in refused] == [False] * 6


def test_a_forced_call_is_its_arguments_after_the_opening(ll_tokenizer, smollm2_tokenizer):
    fmt = HermesFormat()
    strict = argument_schemas(TOOLS)
    opening = fmt.open_tag + fmt.body_head("roll_dice")
    grammar = tool_call_grammar(fmt, ("roll_dice",), strict, opening)
    assert accepts(ll_tokenizer, smollm2_tokenizer, grammar, '{"sides": 20}}')
    assert not accepts(ll_tokenizer, smollm2_tokenizer, grammar, '{"sides": 2.5}}')
    several = tool_call_grammar(fmt, ("get_weather", "roll_dice"), strict, fmt.opening(None))
    assert accepts(ll_tokenizer, smollm2_tokenizer, several, 'roll_dice", "arguments": {"sides": 4}}')
    assert not accepts(ll_tokenizer, smollm2_tokenizer, several, 'roll_dice", "arguments": {"faces": 4}}')


def body(**fields) -> dict:
    return {"model": "tiny-llama", "messages": [{"role": "user", "content": "Roll a die"}], "tools": TOOLS,
            "max_tokens": 48, **fields}


def test_the_request_sets_up_the_grammar_by_tool_choice(tiny_loaded):
    named = parse_request(body(tool_choice={"type": "function", "function": {"name": "roll_dice"}}), CHAT, tiny_loaded)
    assert named.tool_opening == '<tool_call>{"name": "roll_dice", "arguments": '  # the grammar writes the rest
    assert named.sampling.grammar is not None and named.sampling.grammar_param == "tools"
    several = parse_request(body(tool_choice="required"), CHAT, tiny_loaded)
    assert several.tool_opening == '<tool_call>{"name": "' and several.sampling.grammar is not None
    assert parse_request(body(), CHAT, tiny_loaded).sampling.grammar is not None  # auto
    assert parse_request(body(tool_choice="none"), CHAT, tiny_loaded).sampling.grammar is None
    # A named function that is not strict is forced under its schema all the same (test_forced_tool_calls.py).
    free = parse_request(body(tool_choice={"type": "function", "function": {"name": "free_form"}}), CHAT, tiny_loaded)
    assert free.sampling.grammar is not None and free.tool_opening.endswith('"arguments": ')
    # With auto, response_format shapes the answer; a forced call is a call whatever response_format says.
    json_format = {"type": "json_object"}
    auto_json = parse_request(body(response_format=json_format), CHAT, tiny_loaded)
    assert auto_json.sampling.grammar == parse_request(
        {**body(response_format=json_format), "tools": None}, CHAT, tiny_loaded).sampling.grammar
    forced_json = parse_request(body(response_format=json_format, tool_choice={
        "type": "function", "function": {"name": "free_form"}}), CHAT, tiny_loaded)
    assert forced_json.sampling.grammar == free.sampling.grammar
    assert auto_json.sampling.grammar_param == "response_format"


@pytest.mark.parametrize("parameters", [{"type": "object", "properties": {"a": {"type": "no-such-type"}}},
                                        {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}])
def test_a_strict_schema_that_does_not_compile_is_a_400_naming_the_tool(tiny_loaded, parameters):
    tools = [TOOLS[0], tool("broken", parameters)]
    with pytest.raises(InvalidRequest) as raised:
        parse_request(body(tools=tools, tool_choice="none"), CHAT, tiny_loaded)
    assert raised.value.param == "tools[1].function.parameters"
    assert argument_schemas([tool("broken", parameters, strict=False)]) == {}  # only strict schemas, unforced


def sampled_forced_call(engine, request: dict, schemas: dict[str, dict]):
    """Runs a chat `request` whose tool_choice forces a call on `engine` and returns the one call it made, after
    checking that the call closed before max_tokens, came with no other text, and validates against its function's
    schema in `schemas` (by name)."""
    parsed = parse_request(request, CHAT, engine.loaded)
    assert parsed.sampling.grammar is not None
    _, text, finished = asyncio.run(run_to_end(engine, GenerationRequest(parsed.prompt_token_ids, parsed.sampling)))
    assert finished.finish_reason == "stop", text  # the call closed before max_tokens
    stream = ToolCallStream(HermesFormat(), parsed.tool_opening, parsed.tool_choice.function)
    content, calls = stream.feed(text)
    rest, last = stream.finish()
    (made,) = calls + last
    assert (content + rest).strip() == "" and made.complete
    jsonschema.validate(json.loads(made.arguments), schemas[made.name])
    return made


@pytest.mark.parametrize("tool_choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_forced_calls_sampled_from_a_random_model_match_their_schemas(make_engine, tool_choice):
    """The tiny random model writes noise; under the grammar every forced call still validates."""
    engine = make_engine(kv_cache_tokens=4096)
    tools = TOOLS[:2]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    names = set()
    for seed in range(4):
        request = body(tools=tools, tool_choice=tool_choice, seed=seed, temperature=1.0, max_tokens=64)
        names.add(sampled_forced_call(engine, request, schemas).name)
    assert names
