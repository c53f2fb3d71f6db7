"""Requests as ordered, hashed segments; text helpers (first difference, masked shapes, order-free digests)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.explain.segments import (
    chat_segments,
    common_suffix,
    completion_segments,
    first_difference,
    shape_digest,
    unordered_digest,
)

TOOLS = [
    {"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {"x": {}}}}},
    {"type": "function", "function": {"name": "b"}},
]


def chat(messages, tools=None, model="m"):
    body = {"model": model, "messages": messages}
    if tools is not None:
        body["tools"] = tools
    return body


def test_chat_segments_in_prompt_order_with_names():
    prompt = chat(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "bye"},
        ],
        TOOLS,
    )
    segments = chat_segments(prompt)
    assert [s.name for s in segments.segments] == [
        "model",
        "tools",
        "system",
        "messages[1]",
        "messages[2]",
        "messages[3]",
    ]
    assert [s.kind for s in segments.segments] == ["model", "tools", "system", "message", "message", "message"]
    assert segments.segments[2].text == "Be brief." and segments.segments[0].text == "m"
    assert segments.turn_start == 5  # the final user message is the new turn


def test_no_tools_and_no_system_segment_when_absent_and_developer_counts_as_system():
    assert [s.name for s in chat_segments(chat([{"role": "user", "content": "hi"}])).segments] == [
        "model",
        "messages[0]",
    ]
    developer = chat_segments(chat([{"role": "developer", "content": "x"}, {"role": "user", "content": "y"}], []))
    assert [s.name for s in developer.segments] == ["model", "system", "messages[1]"]


def test_final_turn_covers_trailing_user_and_tool_messages():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "1", "content": "42"},
        {"role": "user", "content": "and?"},
    ]
    assert chat_segments(chat(messages)).turn_start == 4  # model, system, u, assistant | tool, user
    ends_with_assistant = messages[:3]
    assert chat_segments(chat(ends_with_assistant)).turn_start == 3  # the last message itself


def test_digests_are_stable_and_follow_the_bytes_as_sent():
    first = chat_segments(chat([{"role": "user", "content": "hi"}], TOOLS))
    again = chat_segments(chat([{"role": "user", "content": "hi"}], [dict(t) for t in TOOLS]))
    assert first.digests == again.digests
    reordered_keys = [{"function": t["function"], "type": t["type"]} for t in TOOLS]
    other = chat_segments(chat([{"role": "user", "content": "hi"}], reordered_keys))
    assert other.digests[1] != first.digests[1] and other.digests[2] == first.digests[2]
    # Same text in another role is another segment.
    assert chat_segments(chat([{"role": "assistant", "content": "hi"}])).digests[1] != first.digests[2]


def test_messages_with_more_than_text_keep_their_json_as_text():
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{}"}}],
    }
    (segment,) = chat_segments(chat([call])).segments[1:]
    assert segment.text.startswith("{") and '"tool_calls"' in segment.text


def test_completion_segments():
    segments = completion_segments({"model": "m", "prompt": ["Once upon a time"]})
    assert [s.name for s in segments.segments] == ["model", "prompt"]
    assert segments.segments[1].text == "Once upon a time"
    assert segments.turn_start == 2
    tokens = completion_segments({"model": "m", "prompt": [1, 2, 3]})
    assert tokens.segments[1].text == "[1,2,3]"


@settings(deadline=None)  # no timing assertion: a slow machine is not a failure
@given(st.text(max_size=60), st.text(max_size=60))
def test_first_difference_is_the_common_prefix_length(a, b):
    expected = 0
    while expected < min(len(a), len(b)) and a[expected] == b[expected]:
        expected += 1
    assert first_difference(a, b) == expected
    assert first_difference(a, a + b) == len(a)


@settings(deadline=None)  # no timing assertion: a slow machine is not a failure
@given(st.text(max_size=60), st.text(max_size=60))
def test_common_suffix_is_the_shared_ending_length(a, b):
    expected = 0
    while expected < min(len(a), len(b)) and a[len(a) - 1 - expected] == b[len(b) - 1 - expected]:
        expected += 1
    assert common_suffix(a, b) == expected


def test_shapes_mask_dates_ids_and_numbers_but_not_words():
    base = "Today is 2025-06-01 (Monday). Ticket 4411, trace 7f0c2a9e-1b2c-4d3e-9f00-123456789abc."
    changed = "Today is 2025-06-02 (Tuesday). Ticket 4412, trace 0a0c2a9e-1b2c-4d3e-9f00-123456789abd."
    assert shape_digest(base) == shape_digest(changed)
    assert shape_digest("Be brief.") != shape_digest("Be concise.")
    assert shape_digest("order 7 of 9") == shape_digest("order 12 of 9")


def test_unordered_digest_ignores_key_and_tool_order_only():
    import json

    text = json.dumps(TOOLS)
    keys_reversed = json.dumps([{k: t[k] for k in reversed(list(t))} for t in TOOLS])
    tools_reversed = json.dumps(list(reversed(TOOLS)))
    digest = unordered_digest("tools", text)
    assert digest is not None
    assert unordered_digest("tools", keys_reversed) == digest == unordered_digest("tools", tools_reversed)
    assert unordered_digest("tools", json.dumps(TOOLS[:1])) != digest
    assert unordered_digest("message", "plain text") is None
    arguments = '{"role": "assistant", "tool_calls": [{"function": {"arguments": "{\\"a\\": 1, \\"b\\": 2}"}}]}'
    swapped = '{"tool_calls": [{"function": {"arguments": "{\\"b\\": 2, \\"a\\": 1}"}}], "role": "assistant"}'
    assert unordered_digest("message", arguments) == unordered_digest("message", swapped)
