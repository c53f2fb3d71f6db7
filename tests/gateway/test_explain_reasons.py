"""Classification: one reason per request from the engine's report and the prompt's divergence (pure, fast)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from db.records import MISS_REASONS
from gateway.explain.compare import compare, similar_texts
from gateway.explain.history import TenantHistory
from gateway.explain.reasons import (
    DIVERGED,
    EXTENDS,
    PREFIX,
    REASONS,
    SAME,
    UNSEEN,
    Divergence,
    Explanation,
    classify,
)
from gateway.upstreams.base import CacheReport

SYSTEM = "You are the assistant of a bicycle shop. Today is 2025-06-01. Answer briefly and never invent prices. " * 3
TOOLS = [
    {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"id": {}}}}},
    {"type": "function", "function": {"name": "book", "description": "Book a repair slot."}},
]
PARTIAL = CacheReport("partial", 40, 100)


def test_every_reason_is_a_database_reason():
    assert set(REASONS) == set(MISS_REASONS)


@pytest.mark.parametrize(
    ("engine", "divergence", "expected"),
    [
        (CacheReport("hit", 99, 100), Divergence(UNSEEN), Explanation("hit", recomputed_tokens=0)),
        (CacheReport("hit", 96, 100), Divergence(UNSEEN), Explanation("below_page", recomputed_tokens=4)),
        (CacheReport(None, 99, 100), Divergence(UNSEEN), Explanation("hit", recomputed_tokens=0)),
        (CacheReport("evicted", 16, 100), Divergence(SAME, shared_segments=2), Explanation("evicted", None, None, 84)),
        (CacheReport("expired", 0, 100), Divergence(UNSEEN), Explanation("expired", None, None, 100)),
        (CacheReport("cold", 0, 100), Divergence(UNSEEN), Explanation("new_prefix", None, None, 100)),
        (PARTIAL, Divergence(EXTENDS, shared_segments=3), Explanation("hit", recomputed_tokens=0)),
        (PARTIAL, Divergence(PREFIX, shared_segments=3), Explanation("hit", recomputed_tokens=0)),
        (PARTIAL, Divergence(SAME, shared_segments=3), Explanation("evicted", None, None, 60)),
        (CacheReport("cold", 0, 100), Divergence(EXTENDS, shared_segments=3), Explanation("evicted", None, None, 100)),
        (
            PARTIAL,
            Divergence(DIVERGED, "messages[1]", "message", 0, 0, True),
            Explanation("new_prefix", None, None, 60),
        ),
        (PARTIAL, Divergence(DIVERGED, "messages[3]", "message", 5, 2, True), Explanation("hit", recomputed_tokens=0)),
        (PARTIAL, Divergence(DIVERGED, "model", "model", 2, 3), Explanation("model_changed", "model", 2, 60)),
        (
            PARTIAL,
            Divergence(DIVERGED, "tools", "tools", 9, 0, reordered=True),
            Explanation("reordered", "tools", 9, 60),
        ),
        (
            PARTIAL,
            Divergence(DIVERGED, "system", "system", 30, 1, volatile=True),
            Explanation("volatile_value", "system", 30, 60),
        ),
        (PARTIAL, Divergence(DIVERGED, "tools", "tools", 7, 0), Explanation("tools_changed", "tools", 7, 60)),
        (PARTIAL, Divergence(DIVERGED, "system", "system", 7, 1), Explanation("system_changed", "system", 7, 60)),
        (
            PARTIAL,
            Divergence(DIVERGED, "messages[2]", "message", 3, 2),
            Explanation("messages_changed", "messages[2]", 3, 60),
        ),
        (
            PARTIAL,
            Divergence(DIVERGED, "system", "system", 0, 0, similar=False),
            Explanation("new_prefix", None, None, 60),
        ),
        (
            CacheReport(),
            Divergence(DIVERGED, "system", "system", 4, 1),
            Explanation("system_changed", "system", 4, None),
        ),
    ],
)
def test_classification_table(engine, divergence, expected):
    assert classify(engine, divergence) == expected


engines = st.builds(
    CacheReport,
    st.sampled_from([None, "hit", "partial", "cold", "evicted", "expired"]),
    st.one_of(st.none(), st.integers(0, 50)),
    st.one_of(st.none(), st.integers(0, 50)),
)
divergences = st.builds(
    Divergence,
    st.sampled_from([UNSEEN, SAME, EXTENDS, PREFIX, DIVERGED]),
    st.sampled_from([None, "model", "tools", "system", "messages[2]", "prompt"]),
    st.sampled_from([None, "model", "tools", "system", "message", "prompt"]),
    st.one_of(st.none(), st.integers(0, 100)),
    st.integers(0, 5),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)


@settings(deadline=None)  # no timing assertion: a slow machine is not a failure
@given(engines, divergences)
def test_classification_is_total_and_deterministic(engine, divergence):
    explanation = classify(engine, divergence)
    assert explanation == classify(engine, divergence)
    assert explanation.reason in MISS_REASONS
    if explanation.reason == "hit":
        assert explanation.recomputed_tokens == 0
    if explanation.segment is not None:
        assert divergence.relation == DIVERGED and explanation.segment == divergence.segment
    if explanation.recomputed_tokens is not None:
        assert explanation.recomputed_tokens >= 0


# --- end to end over real request bodies: segments -> history -> compare -> classify ---------------------------------


def chat(system=SYSTEM, user="Where is order 77?", tools=TOOLS, history=(), model="bike-model"):
    messages = [{"role": "system", "content": system}, *history, {"role": "user", "content": user}]
    body = {"model": model, "messages": messages}
    if tools:
        body["tools"] = tools
    return body


def explain_pair(first, second, engine=PARTIAL):
    from gateway.explain.segments import chat_segments

    history = TenantHistory()
    history.add(chat_segments(first))
    segments = chat_segments(second)
    return classify(engine, compare(segments, history.nearest(segments), history.text))


TURN = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"}]


def test_pairs_for_every_structural_reason():
    assert explain_pair(chat(), chat(), CacheReport("hit", 99, 100)).reason == "hit"
    assert explain_pair(chat(user="Hello"), chat(history=TURN, user="And then?")).reason == "hit"  # grew
    assert explain_pair(chat(user="a"), chat(user="b")).reason == "hit"  # a new question under the same prefix
    assert explain_pair(chat(), chat(model="other"), CacheReport("cold", 0, 100)) == Explanation(
        "model_changed", "model", 0, 100
    )
    changed_tools = [TOOLS[0], {**TOOLS[1], "function": {"name": "book", "description": "Book a slot."}}]
    assert explain_pair(chat(), chat(tools=changed_tools)).reason == "tools_changed"
    assert explain_pair(chat(), chat(tools=TOOLS[::-1])).reason == "reordered"
    edited = SYSTEM.replace("briefly", "politely", 1)
    system = explain_pair(chat(), chat(system=edited))
    assert (system.reason, system.segment, system.char_offset) == ("system_changed", "system", SYSTEM.index("briefly"))
    volatile = explain_pair(chat(), chat(system=SYSTEM.replace("2025-06-01", "2025-06-02")))
    assert (volatile.reason, volatile.segment, volatile.char_offset) == ("volatile_value", "system", SYSTEM.index("1."))
    rewritten = [{"role": "user", "content": "Hello there"}, TURN[1]]
    messages = explain_pair(chat(history=TURN), chat(history=rewritten))
    assert (messages.reason, messages.segment, messages.char_offset) == ("messages_changed", "messages[1]", 5)
    assert explain_pair(chat(), chat(system="Unrelated instructions.", tools=None)).reason == "new_prefix"
    assert explain_pair(chat(tools=None), chat(system="Unrelated instructions.", tools=None)).reason == "new_prefix"


def turns(count):
    """Earlier turns: (question, answer) pairs."""
    return [
        [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]
        for i in range(count)
    ]


def test_reordered_earlier_messages_are_told_apart_from_edits():
    pairs = turns(3)
    swapped = [*pairs[1], *pairs[0], *pairs[2]]
    explanation = explain_pair(chat(history=sum(pairs, [])), chat(history=swapped))
    assert (explanation.reason, explanation.segment) == ("reordered", "messages[1]")


TOOL_SET = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {"q": {}}}}}
    for name in ("alpha", "beta", "gamma", "delta")
]


@settings(deadline=None)  # no timing assertion: a slow machine is not a failure
@given(st.permutations(range(len(TOOL_SET))))
def test_any_other_order_of_the_same_tools_is_reordered(order):
    tools = [TOOL_SET[i] for i in order]
    explanation = explain_pair(chat(tools=TOOL_SET), chat(tools=tools))
    if list(order) == sorted(order):
        assert explanation.reason == "evicted"  # identical prompt, yet the engine matched only part of it
    else:
        assert (explanation.reason, explanation.segment) == ("reordered", "tools")


@settings(deadline=None)  # no timing assertion: a slow machine is not a failure
@given(st.permutations(range(3)))
def test_any_other_order_of_earlier_turns_is_reordered(order):
    pairs = turns(3)
    moved = sum((pairs[i] for i in order), [])
    explanation = explain_pair(chat(history=sum(pairs, [])), chat(history=moved))
    expected = "evicted" if list(order) == [0, 1, 2] else "reordered"
    assert explanation.reason == expected


def test_similar_texts():
    assert similar_texts("You are a helpful shop assistant.", "You are a helpful bike shop assistant.")
    assert similar_texts("Hello! Be brief.", "Hi! Be brief.")  # edited at the start, same ending
    assert not similar_texts("You are a pirate.", "Translate to French:")
    assert not similar_texts("", "x")


def test_differences_in_the_final_turn_of_many_permutations_are_hits():
    for first, second in itertools.permutations(["a", "b", "c"], 2):
        assert explain_pair(chat(user=first), chat(user=second)).reason == "hit"
