"""Normalization rules: examples for each rule, and hypothesis properties (pure, idempotent, honest `changed`)."""

from __future__ import annotations

import copy
import json
import string
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import ALL_RULES, SEMANTIC_RULES, TenantSettings
from gateway.conversations.answer import ToolCall as AnswerCall
from gateway.conversations.returned import ReturnedCalls
from gateway.normalize.pipeline import build_pipeline
from gateway.normalize.rules import (
    Newlines,
    ToolCallArgumentsKeyOrder,
    ToolOrder,
    ToolSchemaKeyOrder,
    canonical_json_text,
    sort_keys_recursive,
)
from gateway.normalize.volatile import NOTE_HEADER, HoistVolatile


def ordered(value: Any) -> str:
    """A serialisation that keeps key order, so order changes are visible."""
    return json.dumps(value, ensure_ascii=False)


def tool(name: str, properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": properties}, **extra},
    }


# --- examples ------------------------------------------------------------------------------------------------------


def test_tool_schema_key_order_sorts_recursively():
    request = {
        "model": "m",
        "tools": [
            {
                "function": {
                    "parameters": {
                        "type": "object",
                        "properties": {"z": {"type": "string", "description": "d"}, "a": {"type": "integer"}},
                    },
                    "name": "f",
                },
                "type": "function",
            }
        ],
    }
    result = ToolSchemaKeyOrder().apply(request)
    assert result.changed
    function = result.request["tools"][0]["function"]
    assert list(result.request["tools"][0]) == ["function", "type"]
    assert list(function) == ["name", "parameters"]
    assert list(function["parameters"]["properties"]) == ["a", "z"]
    assert list(function["parameters"]["properties"]["z"]) == ["description", "type"]
    assert result.request["tools"] == request["tools"]  # same content, only order differs


def test_tool_schema_key_order_unchanged_returns_same_object():
    request = {"model": "m", "tools": [{"function": {"name": "f"}, "type": "function"}]}
    result = ToolSchemaKeyOrder().apply(request)
    assert not result.changed and result.request is request


def test_tool_order_sorts_by_name_and_is_stable():
    request = {"tools": [tool("zeta", {}), tool("alpha", {}), tool("mid", {"x": {}}), tool("mid", {"y": {}})]}
    result = ToolOrder().apply(request)
    assert result.changed
    names = [t["function"]["name"] for t in result.request["tools"]]
    assert names == ["alpha", "mid", "mid", "zeta"]
    assert list(result.request["tools"][1]["function"]["parameters"]["properties"]) == ["x"]
    assert [t["function"]["name"] for t in request["tools"]] == ["zeta", "alpha", "mid", "mid"]


def test_tool_call_arguments_are_written_back_as_returned_and_left_alone_otherwise():
    returned = ReturnedCalls(lambda tenant: tenant.encode().ljust(32, b"k"))
    returned.remember("acme", [AnswerCall("f", '{"b": 1, "a": {"d": 2, "c": "é"}}')], expires_at=float("inf"))
    calls = [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a":{"c":"\\u00e9","d":2},"b":1}'}},
        {"id": "2", "type": "function", "function": {"name": "g", "arguments": '{"b":1,"a":2}'}},  # never returned
        {"id": "3", "type": "function", "function": {"name": "f", "arguments": "not json {"}},
    ]
    request = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None,
                                                                 "tool_calls": calls}]}
    result = ToolCallArgumentsKeyOrder(returned.lookup_for("acme")).apply(request)
    assert result.changed
    sent = [call["function"]["arguments"] for call in result.request["messages"][1]["tool_calls"]]
    assert sent == ['{"b": 1, "a": {"d": 2, "c": "é"}}', '{"b":1,"a":2}', "not json {"]
    assert request["messages"][1]["tool_calls"] is calls and calls[0]["function"]["arguments"].startswith('{"a"')
    # Another tenant was returned nothing; without a lookup the rule changes nothing at all.
    assert not ToolCallArgumentsKeyOrder(returned.lookup_for("other")).apply(request).changed
    assert not ToolCallArgumentsKeyOrder().apply(request).changed


def test_tool_call_arguments_ignores_non_assistant_messages():
    request = {"messages": [{"role": "user", "tool_calls": [{"function": {"arguments": '{"b":1,"a":2}'}}]}]}
    assert not ToolCallArgumentsKeyOrder().apply(request).changed


def test_newlines_in_strings_parts_and_prompts():
    request = {
        "messages": [
            {"role": "system", "content": "\ufeffline1\r\nline2\rline3"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a\r\nb"}, {"type": "image_url", "image_url": {"url": "x"}}],
            },
        ]
    }
    result = Newlines().apply(request)
    assert result.changed
    assert result.request["messages"][0]["content"] == "line1\nline2\nline3"
    assert result.request["messages"][1]["content"][0]["text"] == "a\nb"
    assert result.request["messages"][1]["content"][1] is request["messages"][1]["content"][1]
    answer = {"role": "assistant", "content": "as the model wrote it\r\n\ufeff"}
    assert Newlines().apply({"messages": [answer]}).request["messages"][0] is answer  # an answer re-sent as returned
    completion = Newlines().apply({"prompt": "x\r\ny"})
    assert completion.changed and completion.request["prompt"] == "x\ny"
    assert Newlines().apply({"prompt": ["a\r", "b"]}).request["prompt"] == ["a\n", "b"]
    assert not Newlines().apply({"prompt": "clean\n"}).changed


def test_hoist_volatile_moves_values_after_the_system_prompt():
    rule = HoistVolatile()
    system = "You are helpful. Current time: 2025-06-01T10:32:07Z. Session 123e4567-e89b-12d3-a456-426614174000."
    request = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]}
    result = rule.apply(request)
    assert result.changed
    messages = result.request["messages"]
    assert messages[0]["content"] == "You are helpful. Current time: [volatile#1]. Session [volatile#2]."
    assert messages[1]["role"] == "system"
    assert messages[1]["content"].startswith(NOTE_HEADER)
    assert "2025-06-01T10:32:07Z" in messages[1]["content"]
    assert "123e4567-e89b-12d3-a456-426614174000" in messages[1]["content"]
    assert messages[2] == {"role": "user", "content": "hi"}


def test_hoist_volatile_keeps_the_prefix_identical_across_values():
    rule = HoistVolatile()

    def system_of(moment: str) -> str:
        request = {
            "messages": [
                {"role": "system", "content": f"Long instructions. Today is {moment}."},
                {"role": "user", "content": "q"},
            ]
        }
        return rule.apply(request).request["messages"][0]["content"]

    assert system_of("2025-06-01") == system_of("2031-12-24") == system_of("June 1, 2025")


def test_hoist_volatile_end_placement_and_custom_patterns():
    rule = HoistVolatile(patterns=(r"ticket-\d+",), placement="end")
    request = {
        "messages": [
            {"role": "developer", "content": "Handle ticket-42 today 2025-01-01"},
            {"role": "user", "content": "hi"},
        ]
    }
    result = rule.apply(request)
    assert result.request["messages"][0]["content"] == "Handle [volatile#1] today 2025-01-01"
    assert result.request["messages"][-1]["content"].endswith("ticket-42")
    assert result.request["messages"][1] == {"role": "user", "content": "hi"}


def test_hoist_volatile_leaves_requests_without_system_prompt_alone():
    request = {"messages": [{"role": "user", "content": "today is 2025-01-01"}]}
    result = HoistVolatile().apply(request)
    assert not result.changed and result.request is request


def test_pipeline_reports_applied_rules_in_order_and_respects_settings():
    request = {
        "model": "m",
        "messages": [{"role": "system", "content": "at 2025-01-01\r\n"}, {"role": "user", "content": "x"}],
        "tools": [tool("b", {"z": {}, "a": {}}), tool("a", {})],
    }
    default = build_pipeline(TenantSettings())
    assert default.rule_names == SEMANTIC_RULES
    assert default.apply(request).applied_rules == ("newlines", "tool_schema_key_order", "tool_order")
    everything = build_pipeline(TenantSettings(rules=frozenset(ALL_RULES)))
    assert everything.apply(request).applied_rules == (
        "newlines",
        "tool_schema_key_order",
        "tool_order",
        "hoist_volatile",
    )
    nothing = build_pipeline(TenantSettings(rules=frozenset()))
    result = nothing.apply(request)
    assert result.applied_rules == () and result.request is request


def test_a_failing_rule_is_skipped_not_fatal():
    deep: Any = {"b": 1, "a": 1}
    for _ in range(5000):
        deep = {"z": deep, "a": 0}
    request = {
        "model": "m",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": deep}}],
        "messages": [{"role": "user", "content": "x\r\n"}],
    }
    result = build_pipeline(TenantSettings()).apply(request)
    assert "tool_schema_key_order" not in result.applied_rules
    assert result.applied_rules == ("newlines",)


def test_equivalent_tool_lists_normalize_to_identical_bytes():
    first = {
        "tools": [
            tool("search", {"q": {"type": "string"}, "k": {"type": "integer"}}),
            tool("fetch", {"url": {"type": "string"}}),
        ]
    }
    second = {
        "tools": [
            {
                "function": {
                    "parameters": {"properties": {"url": {"type": "string"}}, "type": "object"},
                    "name": "fetch",
                },
                "type": "function",
            },
            {
                "type": "function",
                "function": {
                    "name": "search",
                    "parameters": {"properties": {"k": {"type": "integer"}, "q": {"type": "string"}}, "type": "object"},
                },
            },
        ]
    }
    pipeline = build_pipeline(TenantSettings())
    assert ordered(pipeline.apply(first).request) == ordered(pipeline.apply(second).request)


def test_sort_keys_and_canonical_json_helpers():
    value, changed = sort_keys_recursive({"b": [{"d": 1, "c": 2}], "a": 1})
    assert changed and ordered(value) == '{"a": 1, "b": [{"c": 2, "d": 1}]}'
    assert canonical_json_text("[1, 2]") == "[1,2]"
    assert canonical_json_text("nope") is None


# --- properties ----------------------------------------------------------------------------------------------------

_TEXT = st.text(alphabet=string.ascii_letters + string.digits + " \r\n\ufeff:-/TZ.é", max_size=40)
_VOLATILE = st.sampled_from(
    [
        "2025-06-01",
        "2025-06-01T10:32:07Z",
        "10:32",
        "10:32:07 PM",
        "06/01/2025",
        "June 1, 2025",
        "Monday, 1 June 2025",
        "123e4567-e89b-12d3-a456-426614174000",
        "deadbeefcafebabe1234",
        "1717236727",
        "[volatile#1]",
    ]
)
_SYSTEM_TEXT = st.lists(st.one_of(_TEXT, _VOLATILE), max_size=6).map("".join)
_KEY = st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=5)
_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), st.text(max_size=8)),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(_KEY, children, max_size=4)),
    max_leaves=12,
)
_TOOL = st.builds(
    lambda name, schema, order: dict(
        sorted({"type": "function", "function": {"name": name, "parameters": schema}}.items(), reverse=order)
    ),
    st.text(alphabet="abcdef", min_size=1, max_size=3),
    st.dictionaries(_KEY, _JSON, max_size=4),
    st.booleans(),
)
_ARGUMENTS = st.one_of(
    st.dictionaries(_KEY, _JSON, max_size=4).map(json.dumps),
    st.dictionaries(_KEY, _JSON, max_size=4).map(lambda d: json.dumps(d, separators=(",", ":"), sort_keys=True)),
    st.text(max_size=10),
)
_CONTENT = st.one_of(
    _SYSTEM_TEXT,
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _SYSTEM_TEXT}), max_size=3),
    st.none(),
)
_MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "tool"]), "content": _CONTENT}),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "content": st.one_of(st.none(), _TEXT),
            "tool_calls": st.lists(
                st.fixed_dictionaries(
                    {
                        "id": _KEY,
                        "type": st.just("function"),
                        "function": st.fixed_dictionaries({"name": _KEY, "arguments": _ARGUMENTS}),
                    }
                ),
                max_size=3,
            ),
        }
    ),
)
_CHAT_REQUEST = st.fixed_dictionaries(
    {"model": st.just("m"), "messages": st.lists(_MESSAGE, min_size=1, max_size=5)},
    optional={"tools": st.lists(_TOOL, max_size=4)},
)
_COMPLETION_REQUEST = st.fixed_dictionaries(
    {"model": st.just("m"), "prompt": st.one_of(_SYSTEM_TEXT, st.lists(_SYSTEM_TEXT, max_size=3))}
)
_REQUEST = st.one_of(_CHAT_REQUEST, _COMPLETION_REQUEST)

RULES = [
    ToolSchemaKeyOrder(),
    ToolOrder(),
    ToolCallArgumentsKeyOrder(),
    Newlines(),
    HoistVolatile(),
    HoistVolatile(placement="end"),
    HoistVolatile(patterns=(r"\d", r"[a-z]+")),  # aggressive patterns that also match inside placeholders
]
PROPERTY_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check_rule(rule: Any, request: dict[str, Any]) -> None:
    snapshot = copy.deepcopy(request)
    before = ordered(request)
    first = rule.apply(request)
    # Pure: the input is untouched, key order included.
    assert ordered(request) == before and request == snapshot
    # Honest `changed`: unchanged means the very same object; changed means different bytes.
    if first.changed:
        assert ordered(first.request) != before
    else:
        assert first.request is request
    # Idempotent.
    second = rule.apply(first.request)
    assert not second.changed, f"{rule.name} changed its own output"
    assert second.request is first.request
    # Deterministic.
    assert ordered(rule.apply(copy.deepcopy(snapshot)).request) == ordered(first.request)


@PROPERTY_SETTINGS
@given(_REQUEST)
def test_every_rule_is_pure_idempotent_and_honest(request):
    for rule in RULES:
        _check_rule(rule, request)


@PROPERTY_SETTINGS
@given(_REQUEST)
def test_full_pipeline_is_idempotent(request):
    pipeline = build_pipeline(TenantSettings(rules=frozenset(ALL_RULES)))
    snapshot = copy.deepcopy(request)
    first = pipeline.apply(request)
    assert request == snapshot
    second = pipeline.apply(first.request)
    assert second.applied_rules == ()
    assert ordered(second.request) == ordered(first.request)


@PROPERTY_SETTINGS
@given(st.lists(_TOOL, min_size=1, max_size=5), st.randoms())
def test_tool_permutations_normalize_to_the_same_bytes(tools, rnd):
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        return  # same-named tools keep their relative order by design
    shuffled = list(tools)
    rnd.shuffle(shuffled)
    reordered = [json.loads(json.dumps(t, sort_keys=True)) for t in shuffled]
    pipeline = build_pipeline(TenantSettings())
    a = pipeline.apply({"model": "m", "tools": tools}).request
    b = pipeline.apply({"model": "m", "tools": reordered}).request
    assert ordered(a) == ordered(b)
