"""Four explanations that used to be wrong, from the engine's own report (pure, fast): a model alias to the same
engine, an answer re-sent with its whitespace changed, a shared opening shorter than a page, a tool result re-sent
with its keys in another order; and no reason at all when the upstream reports no cached tokens."""

from __future__ import annotations

import json
from dataclasses import replace

from gateway.conversations.link import AnswerRewrite, ConversationLink
from gateway.explain.history import TenantHistory
from gateway.explain.located import explain_located
from gateway.explain.reasons import Explanation
from gateway.explain.segments import chat_segments
from gateway.upstreams.base import CacheReport

SYSTEM = "You are the support assistant of a bicycle shop."
ANSWER = "We open at nine.\n\nOn Sundays we are closed."


def body(*messages: dict, model: str = "smollm2") -> dict:
    return {"model": model, "messages": [{"role": "system", "content": SYSTEM}, *messages]}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def explain(history: TenantHistory, request: dict, engine: CacheReport, link: ConversationLink | None = None):
    segments = chat_segments(request)
    explanation = explain_located(engine, segments, history.nearest(segments), history, link)
    history.add(segments, engine.prompt_tokens)
    return explanation


def engine(matched: int, segment: str, offset: int, miss: str = "partial", **extra) -> CacheReport:
    return CacheReport(miss, matched, 120, 3, segment, offset, page_size=1, **extra)


def test_a_model_alias_reaching_the_same_cache_is_a_hit_where_the_cached_answer_ends():
    history = TenantHistory()
    history.add(chat_segments(body(user("When are you open?"))), 40)
    turn = body(user("When are you open?"), assistant(ANSWER), user("Sunday?"), model="SmolLM2-135M-Instruct")
    report = engine(70, "messages[2]", len(ANSWER), seen_tokens=71, seen_segment="messages[2]",
                    seen_char_offset=len(ANSWER))
    assert explain(history, turn, report) == Explanation("hit", "messages[2]", len(ANSWER), 0, source="engine")


def test_an_answer_resent_with_a_blank_line_collapsed_is_answer_rewritten_where_it_changed():
    history = TenantHistory()
    history.add(chat_segments(body(user("When are you open?"))), 40)
    collapsed = ANSWER.replace("\n\n", "\n")
    turn = body(user("When are you open?"), assistant(collapsed), user("Sunday?"))
    at = ANSWER.index("\n\n")
    report = engine(48, "messages[2]", at, seen_tokens=48, seen_segment="messages[2]", seen_char_offset=at)
    explanation = explain(history, turn, report)
    assert (explanation.reason, explanation.segment, explanation.char_offset) == ("answer_rewritten", "messages[2]", at)
    # The conversation's own account of the rewrite wins (its segment and offset).
    link = ConversationLink("c", "content", 2, "r1", 1.0, 4, AnswerRewrite("whitespace", "messages[2]", 3, at))
    by_link = explain(TenantHistory(), turn, replace(report, seen_segment=None, seen_char_offset=None), link)
    assert (by_link.reason, by_link.segment, by_link.char_offset) == ("answer_rewritten", "messages[2]", at)


def test_an_edited_earlier_user_message_is_not_an_answer_rewrite():
    history = TenantHistory()
    history.add(chat_segments(body(user("My bike is red."), assistant("Noted."), user("Tyres?"))), 60)
    edited = body(user("My bike is blue."), assistant("Noted."), user("Tyres?"))
    report = engine(20, "messages[1]", 11, seen_tokens=20, seen_segment="messages[1]", seen_char_offset=11)
    assert explain(history, edited, report).reason == "messages_changed"


def test_a_shared_opening_shorter_than_a_page_is_below_page_not_evicted():
    history = TenantHistory()
    history.add(chat_segments(body(user("Name three rivers."))), 30)
    report = CacheReport("cold", 0, 30, 3, "system", 0, page_size=16, seen_tokens=12)
    explanation = explain(history, body(user("What is two plus two?")), report)
    assert (explanation.reason, explanation.segment, explanation.char_offset) == ("below_page", "system", 0)


def test_a_tool_result_resent_with_its_keys_in_another_order_is_reordered():
    call = {"id": "c1", "type": "function", "function": {"name": "lookup_order", "arguments": '{"id": "7"}'}}
    result = {"status": "shipped", "eta": "Monday"}

    def turn(content: dict, *more: dict) -> dict:
        return body(user("Where is order 7?"), {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "c1", "content": json.dumps(content)}, *more)

    history = TenantHistory()
    history.add(chat_segments(turn(result)), 60)
    resent = turn(dict(reversed(result.items())), assistant("Monday."), user("And order 8?"))
    explanation = explain(history, resent, engine(50, "messages[3]", 2))
    assert (explanation.reason, explanation.segment) == ("reordered", "messages[3]")
    # With 16-token pages the match may end in the tool call before it: where the computed tokens end decides.
    paged = replace(engine(48, "messages[2]", 5), seen_tokens=52, seen_segment="messages[3]", seen_char_offset=2)
    history = TenantHistory()
    history.add(chat_segments(turn(result)), 60)
    explanation = explain(history, resent, paged)
    assert (explanation.reason, explanation.segment, explanation.char_offset) == ("reordered", "messages[3]", 2)
