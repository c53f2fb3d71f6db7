"""The Messages API's pure parts: validation, breakpoints, usage accounting, translation and normalization."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.anthropic.accounting import CachePoint, common_prefix, split_usage
from gateway.anthropic.normalize import normalize
from gateway.anthropic.request import Breakpoint, parse_messages_request
from gateway.anthropic.stream import ChunkTranslator
from gateway.anthropic.translate import ChatStyle, cut_at, message_content, stop_reason, to_chat_body
from gateway.config import TenantSettings, parse_config
from gateway.config.messages import DEFAULT_MIN_CACHEABLE_TOKENS, MessagesSettings, parse_messages_settings
from gateway.errors import BadRequest, ConfigError

EPHEMERAL = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}


def parse(body: dict) -> object:
    return parse_messages_request(json.dumps(body).encode())


def base(**changes) -> dict:
    return {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **changes}


def error_of(body: dict) -> str:
    with pytest.raises(BadRequest) as caught:
        parse(body)
    return caught.value.message


def test_breakpoints_are_found_in_prompt_order_with_their_ttl():
    body = base(
        tools=[{"name": "a", "input_schema": {}, "cache_control": HOUR}],
        system=[{"type": "text", "text": "s", "cache_control": HOUR}, {"type": "text", "text": "t"}],
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y", "cache_control": EPHEMERAL}],
            }
        ],
    )
    parsed = parse(body)
    assert parsed.breakpoints == (
        Breakpoint("tools", 0, None, "1h"),
        Breakpoint("system", 0, None, "1h"),
        Breakpoint("messages", 0, 1, "5m"),
    )
    assert parsed.retention_class == "1h"
    assert parse(base()).retention_class is None
    assert parse(base(system=[{"type": "text", "text": "s", "cache_control": EPHEMERAL}])).retention_class == "5m"


def test_more_than_four_breakpoints_is_a_400():
    system = [{"type": "text", "text": str(i), "cache_control": EPHEMERAL} for i in range(5)]
    assert error_of(base(system=system)) == "A maximum of 4 blocks with cache_control may be provided. Found 5."
    assert len(parse(base(system=system[:4])).breakpoints) == 4


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens: Field required"),
        (base(max_tokens=0), "max_tokens: must be a positive integer"),
        (base(model=None), "model: Field required"),
        (base(messages=[]), "messages: must be a non-empty list"),
        (base(messages=[{"role": "system", "content": "x"}]), "messages[0].role: must be 'user' or 'assistant'"),
        (base(temperature=1.5), "temperature: must be a number between 0 and 1"),
        (base(stop_sequences="END"), "stop_sequences: must be a list of non-empty strings"),
        (base(metadata={"user_id": 3}), "metadata.user_id: must be a string"),
        (base(tool_choice={"type": "maybe"}), "tool_choice.type: must be one of 'auto', 'any', 'tool', 'none'"),
        (
            base(tool_choice={"type": "tool", "name": "nope"}),
            "tool_choice.name: 'nope' is not one of the tools in the request",
        ),
        (base(tools=[{"name": "t"}]), "tools[0].input_schema: Field required (a JSON schema object)"),
        (
            base(system=[{"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "10m"}}]),
            "system[0].cache_control.ttl: must be '5m' or '1h', not '10m'",
        ),
        (
            base(
                system=[
                    {"type": "text", "text": "a", "cache_control": EPHEMERAL},
                    {"type": "text", "text": "b", "cache_control": HOUR},
                ]
            ),
            "system[1].cache_control: a ttl='1h' cache_control block must not come after a ttl='5m' one (system[0])",
        ),
    ],
)
def test_invalid_requests_name_the_field(body, message):
    assert error_of(body) == message


@pytest.mark.parametrize(
    ("block", "where"),
    [
        (
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}},
            "messages[0].content[0]",
        ),
        (
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}},
            "messages[0].content[0]",
        ),
        ({"type": "thinking", "thinking": "hmm", "signature": "s"}, "messages[0].content[0]"),
    ],
)
def test_unsupported_blocks_are_named(block, where):
    role = "assistant" if block["type"] == "thinking" else "user"
    message = error_of(base(messages=[{"role": role, "content": [block]}]))
    assert message.startswith(f"{where}: content blocks of type {block['type']!r} are not supported")
    nested = {"type": "tool_result", "tool_use_id": "t1", "content": [block]}
    if role == "user":
        assert "messages[0].content[0].content[0]: content blocks of type" in error_of(
            base(messages=[{"role": "user", "content": [nested]}])
        )


def test_server_tools_are_refused():
    message = error_of(base(tools=[{"type": "web_search_20250305", "name": "web_search"}]))
    assert message.startswith("tools[0]: tools of type 'web_search_20250305'")


def test_count_only_does_not_need_max_tokens():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert parse_messages_request(json.dumps(body).encode(), count_only=True).model == "m"


def test_split_usage_reads_writes_and_the_rest():
    points = [CachePoint(100, "1h"), CachePoint(180, "5m")]
    first = split_usage(200, 0, points, min_cacheable_tokens=50)
    assert (first.input_tokens, first.cache_read_input_tokens, first.cache_creation_input_tokens) == (20, 0, 180)
    assert (first.ephemeral_1h_input_tokens, first.ephemeral_5m_input_tokens) == (100, 80)
    # The engine matched past the first breakpoint: 120 read, the rest up to the last breakpoint written.
    second = split_usage(200, 120, points, min_cacheable_tokens=50)
    assert (second.input_tokens, second.cache_read_input_tokens, second.cache_creation_input_tokens) == (20, 120, 60)
    assert (second.ephemeral_1h_input_tokens, second.ephemeral_5m_input_tokens) == (0, 60)
    # Reads never go past the last breakpoint, whatever the engine matched.
    third = split_usage(200, 199, points, min_cacheable_tokens=50)
    assert (third.input_tokens, third.cache_read_input_tokens, third.cache_creation_input_tokens) == (20, 180, 0)
    assert third.as_dict(5) == {
        "input_tokens": 20,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 180,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "output_tokens": 5,
    }


def test_split_usage_below_the_minimum_caches_nothing():
    points = [CachePoint(40, "5m"), CachePoint(120, "5m")]
    short = split_usage(150, 140, points, min_cacheable_tokens=200)
    assert (short.input_tokens, short.cache_read_input_tokens, short.cache_creation_input_tokens) == (150, 0, 0)
    # Only the breakpoint past the minimum counts.
    partial = split_usage(150, 0, points, min_cacheable_tokens=100)
    assert (partial.input_tokens, partial.cache_creation_input_tokens) == (30, 120)
    # A match shorter than the minimum (the template's opening tokens) is no read: the prefix is written.
    opening = split_usage(150, 4, points, min_cacheable_tokens=100)
    assert (opening.input_tokens, opening.cache_read_input_tokens, opening.cache_creation_input_tokens) == (30, 0, 120)


def test_the_readme_states_the_minimum_cacheable_length_and_what_is_reported_below_it():
    """The README's Anthropic paragraph names the gateway's default minimum and what a breakpoint below it reports."""
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert "1024 tokens on most Claude models and 2048 on Claude Haiku 3 and 3.5" in readme
    assert f"`[messages] min_cacheable_tokens` (default {DEFAULT_MIN_CACHEABLE_TOKENS};" in readme
    assert "`cache_creation_input_tokens: 0` and `cache_read_input_tokens: 0` (the whole prompt is `input_tokens`)" in readme
    below = split_usage(1000, 990, [CachePoint(900, "5m")], DEFAULT_MIN_CACHEABLE_TOKENS)
    assert below.as_dict()["cache_creation_input_tokens"] == below.as_dict()["cache_read_input_tokens"] == 0
    assert below.input_tokens == 1000


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


TOOL = {
    "name": "get_weather",
    "description": "Weather.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def test_translation_to_the_chat_api():
    body = {
        "model": "m",
        "max_tokens": 9,
        "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "kind.", "cache_control": EPHEMERAL}],
        "tools": [TOOL],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "stop_sequences": ["END"],
        "metadata": {"user_id": "u-1"},
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"unit": "C", "city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21 C"}]},
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
    }
    chat = to_chat_body(body, stream=True)
    assert chat == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        # As chat upstreams write a call's arguments: `json.dumps`, keys in the order returned.
                        "function": {"name": "get_weather", "arguments": '{"unit": "C", "city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "21 C"},
            {"role": "user", "content": "And tomorrow?"},
        ],
        "tools": [
            {
                "function": {"description": "Weather.", "name": "get_weather", "parameters": TOOL["input_schema"]},
                "type": "function",
            }
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 9,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "stop": ["END"],
        "user": "u-1",
        "stream": True,
    }
    plain = to_chat_body(body, stream=False, style=ChatStyle(sorted_tool_keys=False))
    assert list(plain["tools"][0]) == ["type", "function"]
    assert plain["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"unit": "C", "city": "Paris"}'
    assert to_chat_body({**body, "tool_choice": {"type": "tool", "name": "get_weather"}}, stream=False)[
        "tool_choice"
    ] == {
        "type": "function",
        "function": {"name": "get_weather"},
    }
    assert to_chat_body({**body, "tool_choice": {"type": "none"}}, stream=False)["tool_choice"] == "none"


def test_cut_at_a_breakpoint():
    body = {
        "model": "m",
        "tools": [TOOL, {**TOOL, "name": "b"}],
        "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "r"},
            {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
        ],
    }
    assert cut_at(body, Breakpoint("tools", 0, None, "5m"))["tools"] == [TOOL]
    assert cut_at(body, Breakpoint("system", 0, None, "5m"))["system"] == [{"type": "text", "text": "a"}]
    cut = cut_at(body, Breakpoint("messages", 2, 0, "5m"))
    assert cut["messages"][-1] == {"role": "user", "content": [{"type": "text", "text": "x"}]}
    assert len(cut["messages"]) == 3


def test_responses_map_to_content_blocks_and_stop_reasons():
    message = {
        "role": "assistant",
        "content": "Sure.",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
    }
    assert message_content(message) == [
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}},
    ]
    assert stop_reason("stop", None, ["END"]) == ("end_turn", None)
    assert stop_reason("stop", "END", ["END"]) == ("stop_sequence", "END")
    assert stop_reason("length", None, None) == ("max_tokens", None)
    assert stop_reason("tool_calls", None, None) == ("tool_use", None)


def test_stream_translation_opens_and_closes_blocks():
    translator = ChunkTranslator(None)
    out = translator.feed({"choices": [{"delta": {"content": "Hi"}, "finish_reason": None}]})
    out += translator.feed(
        {
            "choices": [
                {"delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a"'}}]}}
            ]
        }
    )
    out += translator.feed({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}}]})
    out += translator.feed({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]})
    out += translator.finish({"output_tokens": 4})
    events = [json.loads(line[6:]) for line in out.decode().splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events] == [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[3]["content_block"] == {"type": "tool_use", "id": "c1", "name": "f", "input": {}}
    assert events[3]["index"] == 1
    assert "".join(e["delta"]["partial_json"] for e in events[4:6]) == '{"a": 1}'
    assert events[7]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


def test_normalization_never_moves_a_tool_across_a_breakpoint():
    tools = [
        {"name": "d", "input_schema": {}},
        {"name": "c", "input_schema": {}, "cache_control": EPHEMERAL},
        {"name": "b", "input_schema": {}},
        {"name": "a", "input_schema": {}},
    ]
    body = base(tools=tools)
    normalized, applied = normalize(body, TenantSettings())
    assert [t["name"] for t in normalized["tools"]] == ["c", "d", "a", "b"]
    # The breakpoint still closes the run of the first two tools.
    assert [("cache_control" in t) for t in normalized["tools"]] == [False, True, False, False]
    assert "tool_order" in applied
    assert body["tools"] is tools and tools[0]["name"] == "d"  # the input is untouched
    assert parse(normalized).breakpoints == (Breakpoint("tools", 1, None, "5m"),)


def test_normalization_newlines_leaves_the_answers_as_returned():
    answer = {"role": "assistant", "content": [{"type": "text", "text": "Sure.\r\n"},
                                               {"type": "tool_use", "id": "t", "name": "f", "input": {"b": 1, "a": 2}}]}
    body = base(
        system="line\r\nline",
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "\ufeffhi\r\n"}]},
            answer,
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok\r\n"}]},
        ],
    )
    normalized, applied = normalize(body, TenantSettings())
    assert normalized["system"] == "line\nline"
    assert normalized["messages"][0]["content"][0]["text"] == "hi\n"
    # The answer re-sent is what the upstream cached: its text and its input's key order as sent.
    assert normalized["messages"][1] is answer
    assert normalized["messages"][2]["content"][0]["content"] == "ok\n"
    assert applied == ("newlines",)
    assert normalize(body, TenantSettings(rules=frozenset()))[1] == ()


def test_messages_settings():
    settings = parse_messages_settings({"min_cacheable_tokens": 2048, "min_cacheable_tokens_by_model": {"smollm2": 64}})
    assert settings == MessagesSettings(2048, {"smollm2": 64})
    assert settings.min_cacheable_for("smollm2") == 64
    assert settings.min_cacheable_for("other") == 2048
    assert parse_config({}).messages.min_cacheable_for("x") == 1024
    assert parse_config({"messages": {"min_cacheable_tokens": 10}}).messages.min_cacheable_tokens == 10
    with pytest.raises(ConfigError):
        parse_messages_settings({"min_cacheable": 3})
    with pytest.raises(ConfigError):
        parse_messages_settings({"min_cacheable_tokens": -1})
    assert (
        parse_config({"upstreams": [{"name": "a", "url": "http://x", "kind": "anthropic"}]}).upstreams[0].kind
        == "anthropic"
    )


def test_the_recorded_tier_split_of_a_messages_request_covers_its_cache_reads():
    # The engine's split describes its whole match (99 tokens), but a Messages row's cached tokens are the reads up
    # to the last breakpoint (91): recorded as they came, the split would not fit in the cached tokens, and the
    # history would count every cached token of the Messages API as of an unknown tier. The reads are the first
    # tokens of the match, which runs device, then host, then disk along the path.
    from types import SimpleNamespace

    from gateway.anthropic.accounting import CachePoint
    from gateway.anthropic.engine_forward import Exchange
    from gateway.upstreams.base import CacheReport, UsageReport
    from gateway.upstreams.tiers import TierSplit

    def recorded(usage: UsageReport, report: CacheReport | None) -> UsageReport:
        exchange = Exchange(None, None, SimpleNamespace(breakpoints=[object()]), b"", None, None, "msg", 64, None,
                            0.0)
        exchange.cache_report = report
        exchange.cache_usage(usage, [CachePoint(91, "5m")])
        return exchange.usage

    body = recorded(UsageReport(prompt_tokens=100, cached_tokens=99, tiers=TierSplit(60, 30, 9)), None)
    assert body.cached_tokens == 91 and body.tiers == TierSplit(60, 30, 1)
    header = recorded(UsageReport(prompt_tokens=100, cached_tokens=99), CacheReport(tiers=TierSplit(99, 0, 0)))
    assert header.cached_tokens == 91 and header.tiers == TierSplit(91, 0, 0)
    unknown = recorded(UsageReport(prompt_tokens=100, cached_tokens=99), None)
    assert unknown.tiers is None
