"""Forced tool calls without `strict`: `tool_choice` naming a function, or `required`, makes the call follow its
function's `parameters` schema as vLLM does, strict or not; `auto` without strict tools stays free; a forced schema
that cannot be compiled is an OpenAI-shaped 400 naming it."""

from __future__ import annotations

import asyncio
import json

import httpx
import llguidance
import llguidance.hf
import pytest

from local_engine.api.protocol import CHAT, parse_request
from local_engine.engine.tool_call_grammar import argument_schemas, closed_objects, tool_call_grammar
from local_engine.engine.types import GenerationRequest
from local_engine.prompt.tool_calls import ToolCallStream
from local_engine.prompt.tool_calls.hermes import HermesFormat

from .conftest import run_to_end
from .server_fixtures import served_engine
from .test_strict_tools import accepts, sampled_forced_call, tool

# A pydantic-style schema (titles, `$defs` and a `$ref`, a nullable field), required fields of several types; the
# bounds keep a random model's strings and numbers short.
PERSON = {
    "$defs": {"Address": {"type": "object", "title": "Address", "properties": {
        "city": {"type": "string", "title": "City", "maxLength": 10},
        "zip_code": {"type": "integer", "minimum": 1000, "maximum": 99999}}, "required": ["city", "zip_code"]}},
    "type": "object",
    "title": "Person",
    "properties": {
        "name": {"type": "string", "title": "Name", "maxLength": 10},
        "age": {"type": "integer", "title": "Age", "minimum": 0, "maximum": 120},
        "height_m": {"type": "number", "minimum": 0.5, "maximum": 2.5},
        "member": {"type": "boolean"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
        "address": {"$ref": "#/$defs/Address"},
        "nickname": {"anyOf": [{"type": "string", "maxLength": 6}, {"type": "null"}], "default": None},
    },
    "required": ["name", "age", "height_m", "member", "role", "tags", "address"],
}
DICE = {"type": "object", "properties": {"sides": {"type": "integer", "minimum": 2, "maximum": 100}},
        "required": ["sides"]}
TOOLS = [tool("save_person", PERSON, strict=False), tool("roll_dice", DICE, strict=False)]
SCHEMAS = {"save_person": PERSON, "roll_dice": DICE}


def body(**fields) -> dict:
    return {"model": "tiny-llama", "messages": [{"role": "user", "content": "Save Ann, 31, from Oslo"}],
            "tools": TOOLS, "max_tokens": 200, **fields}


@pytest.fixture(scope="module")
def ll_tokenizer(smollm2_tokenizer):
    return llguidance.hf.from_tokenizer(smollm2_tokenizer)


def test_a_schema_that_is_not_strict_is_enforced_leniently_once_forced(ll_tokenizer, smollm2_tokenizer):
    fmt = HermesFormat()
    schemas = argument_schemas(TOOLS, ("save_person",))
    assert set(schemas) == {"save_person"} and not schemas["save_person"].strict
    grammar = tool_call_grammar(fmt, ("save_person",), schemas, fmt.opening("save_person"))
    good = {"name": "Ann", "age": 31, "height_m": 1.7, "member": True, "role": "user", "tags": ["a"],
            "address": {"city": "Oslo", "zip_code": 1234}}
    assert accepts(ll_tokenizer, smollm2_tokenizer, grammar, json.dumps(good) + "}")
    assert accepts(ll_tokenizer, smollm2_tokenizer, grammar, json.dumps({**good, "nickname": None}) + "}")
    refused = [
        {key: value for key, value in good.items() if key != "age"},  # a required field missing
        {**good, "age": "31"},  # a string for an integer
        {**good, "address": {"city": "Oslo"}},  # a nested required field missing
        {**good, "role": "owner"},  # outside the enum
        {**good, "extra": 1},  # a key the schema does not list: objects that list their properties are closed
        {**good, "address": {"city": "Oslo", "zip_code": 1234, "country": "NO"}},  # in `$defs` too
    ]
    assert [accepts(ll_tokenizer, smollm2_tokenizer, grammar, json.dumps(r) + "}") for r in refused] == [False] * 6
    # An object that lists no properties stays open.
    free = tool_call_grammar(fmt, ("f",), argument_schemas([tool("f", {"type": "object"}, strict=False)], ("f",)),
                             fmt.opening("f"))
    assert accepts(ll_tokenizer, smollm2_tokenizer, free, '{"anything": [1, {"x": null}]}}')
    # Lenient: a keyword the grammar cannot enforce is ignored, not refused (strict, it is a 400).
    unknown = {"type": "object", "properties": {"day": {"type": "string", "format": "no-such-format"}}}
    assert not argument_schemas([tool("plan", unknown, strict=False)], ("plan",))["plan"].strict


def test_only_objects_that_list_their_properties_and_say_nothing_of_others_are_closed():
    schema = {
        "type": "object",
        "properties": {"properties": {"type": "object", "properties": {"a": {"type": "integer"}}},
                       "any": {"type": "object"}, "map": {"type": "object", "additionalProperties": {"type": "string"}},
                       "both": {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
                       "list": {"type": "array", "items": {"properties": {"c": {}}}},
                       "one": {"anyOf": [{"properties": {"d": {}}}, {"type": "null"}]},
                       "fixed": {"const": {"properties": {"e": 1}}}},
        "$defs": {"Ref": {"properties": {"f": {}}}},
    }
    closed = closed_objects(schema)
    props = closed["properties"]
    assert closed["additionalProperties"] is False and "additionalProperties" not in schema  # a copy
    assert props["properties"]["additionalProperties"] is False  # a property named "properties" is a property
    assert set(props) == set(schema["properties"])
    assert "additionalProperties" not in props["any"] and props["map"] == schema["properties"]["map"]
    assert props["both"] == schema["properties"]["both"]  # allOf members stay open
    assert props["list"]["items"]["additionalProperties"] is False
    assert props["one"]["anyOf"][0]["additionalProperties"] is False and props["one"]["anyOf"][1] == {"type": "null"}
    assert props["fixed"] == schema["properties"]["fixed"]  # a value, not a schema
    assert closed["$defs"]["Ref"]["additionalProperties"] is False
    # A strict schema is taken as written.
    strict = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert argument_schemas([tool("s", strict)])["s"].schema == strict


@pytest.mark.parametrize("tool_choice", [{"type": "function", "function": {"name": "save_person"}}, "required"])
def test_forced_calls_without_strict_sampled_from_a_random_model_match_their_schemas(make_engine, tool_choice):
    """The tiny random model writes noise at temperature 1; every forced call still validates against its schema."""
    engine = make_engine(kv_cache_tokens=4096)
    names = []
    for seed in range(4):
        made = sampled_forced_call(engine, body(tool_choice=tool_choice, seed=seed, temperature=1.0), SCHEMAS)
        names.append(made.name)
    if isinstance(tool_choice, dict):
        assert names == ["save_person"] * 4


def test_auto_without_strict_tools_is_not_constrained(make_engine):
    """No grammar: the random model's answer is its own text, which no call grammar would allow."""
    engine = make_engine(kv_cache_tokens=4096)
    parsed = parse_request(body(seed=0, temperature=1.0, max_tokens=16), CHAT, engine.loaded)
    assert parsed.tool_choice.mode == "auto"
    assert parsed.sampling.grammar is None and parsed.tool_opening == "" and parsed.sampling.stop == ()
    _, text, finished = asyncio.run(run_to_end(engine, GenerationRequest(parsed.prompt_token_ids, parsed.sampling)))
    assert finished.finish_reason == "length" and finished.completion_tokens == 16
    content, calls = ToolCallStream(HermesFormat()).feed(text)
    assert calls == [] and not text.startswith("<tool_call>")


BROKEN = {"type": "object", "properties": {"when": {"$ref": "#/$defs/missing"}}}


@pytest.fixture(scope="module")
def server(tiny_loaded):
    with served_engine(tiny_loaded, kv_cache_tokens=4096) as (base_url, _):
        with httpx.Client(base_url=base_url, timeout=60) as client:
            yield client


@pytest.mark.parametrize("tool_choice", [{"type": "function", "function": {"name": "schedule"}}, "required"])
def test_a_forced_schema_that_does_not_compile_is_a_400_naming_it(server, tool_choice):
    tools = [TOOLS[1], tool("schedule", BROKEN, strict=False)]
    response = server.post("/v1/chat/completions", json=body(tools=tools, tool_choice=tool_choice, max_tokens=4))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "tools[1].function.parameters"
    assert "cannot be compiled" in error["message"] and "missing" in error["message"]


@pytest.mark.parametrize("tool_choice", ["auto", "none", {"type": "function", "function": {"name": "roll_dice"}}])
def test_a_broken_schema_that_is_neither_strict_nor_forced_is_not_compiled(server, tool_choice):
    tools = [TOOLS[1], tool("schedule", BROKEN, strict=False)]
    response = server.post("/v1/chat/completions", json=body(tools=tools, tool_choice=tool_choice, max_tokens=4))
    assert response.status_code == 200, response.text
