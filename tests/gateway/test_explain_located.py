"""Explanations from the engine's own report of where its match ended (pure, fast): the location is the engine's,
the tenant's history only says why, and partial reuse is never `new_prefix`."""

from __future__ import annotations

from dataclasses import replace

import httpx

from gateway.conversations.link import ConversationLink
from gateway.explain.compare import compare
from gateway.explain.history import TenantHistory
from gateway.explain.located import engine_locates, explain_located
from gateway.explain.reasons import Explanation, classify
from gateway.explain.segments import chat_segments
from gateway.explain.uplift import UpliftJob, uplift_gain
from gateway.upstreams import adapter_for
from gateway.upstreams.base import CacheReport

SYSTEM = "Rule one: be polite. Rule two: cite the policy. Today is 2026-11-29. Rule three: never guess prices. " * 4


def chat(system: str = SYSTEM, *turns: str, tools: list | None = None) -> dict:
    roles = ("user", "assistant")
    body = {"model": "m", "messages": [{"role": "system", "content": system}]
            + [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]}
    if tools:
        body["tools"] = tools
    return body


def explain(history: TenantHistory, body: dict, engine: CacheReport) -> Explanation:
    segments = chat_segments(body)
    explanation = explain_located(engine, segments, history.nearest(segments), history)
    history.add(segments, engine.prompt_tokens)
    return explanation


def located(matched: int, segment: str, offset: int, miss: str = "partial", template: int = 3) -> CacheReport:
    return CacheReport(miss, matched, 500, template, segment, offset)


def test_the_location_is_the_engine_s_even_when_the_latest_request_differs_earlier():
    history = TenantHistory()
    base = chat(SYSTEM, "My order is late.", "Sorry.", "What now?")
    history.add(chat_segments(base), 500)
    history.add(chat_segments(chat("Today is Monday.\n" + SYSTEM, "My order is late.", "Sorry.", "What now?")), 500)
    edited = chat(SYSTEM[:300] + "Q" + SYSTEM[301:], "My order is late.", "Sorry.", "What now?")
    # By history alone the nearest (latest) request differs at character 0 of the system prompt.
    segments = chat_segments(edited)
    approximate = classify(CacheReport("partial", 80, 500), compare(segments, history.nearest(segments), history.text))
    assert (approximate.segment, approximate.char_offset) == ("system", 0)
    explanation = explain(history, edited, located(80, "system", 298))
    assert explanation == Explanation("system_changed", "system", 298, 420, source="engine")


def test_partial_reuse_is_never_new_prefix():
    history = TenantHistory()
    history.add(chat_segments(chat(SYSTEM, "Hi")), 500)
    unlike = chat(SYSTEM[:40] + "Something else entirely, unrelated to the shop and its rules.", "Hello")
    explanation = explain(history, unlike, located(12, "system", 40))
    assert explanation.reason == "system_changed" and explanation.source == "engine"
    # With an empty history the engine's partial match still rules out new_prefix.
    assert explain(TenantHistory(), unlike, located(12, "system", 40)).reason == "system_changed"


def test_why_comes_from_the_request_that_shared_the_prefix():
    history = TenantHistory()
    history.add(chat_segments(chat(SYSTEM, "Hi")), 500)
    dated = chat(SYSTEM.replace("2026-11-29", "2026-11-30"), "Hi")
    offset = SYSTEM.index("2026-11-29") + 9
    assert explain(history, dated, located(40, "system", offset)).reason == "volatile_value"
    tools = [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b"}}]
    history.add(chat_segments(chat(SYSTEM, "Hi", tools=tools)), 500)
    reordered = explain(history, chat(SYSTEM, "Hi", tools=tools[::-1]), located(20, "tools", 40))
    assert (reordered.reason, reordered.segment) == ("reordered", "tools")


def test_the_same_text_not_matched_was_dropped_and_a_new_turn_is_a_hit():
    history = TenantHistory()
    body = chat(SYSTEM, "My order is late.", "Sorry.", "What now?")
    history.add(chat_segments(body), 500)
    assert explain(history, body, located(50, "system", 120)).reason == "evicted"
    follow_up = chat(SYSTEM, "My order is late.", "Sorry.", "Can I cancel it?")
    assert explain(history, follow_up, located(450, "messages[3]", 0)) == Explanation(
        "hit", "messages[3]", 0, recomputed_tokens=0, source="engine")  # where the engine's match ended, recorded


def test_the_location_is_where_the_prompt_diverged_from_what_was_computed_before():
    """A page-aligned match ends up to a page before the divergence; the engine's `seen` location is where the
    prompt first differs from what an earlier request computed: a grown turn's new part, an edit's first character,
    and inside a shared opening shorter than a page."""
    history = TenantHistory()
    history.add(chat_segments(chat(SYSTEM, "My order is late.", "Sorry.", "What now?")), 500)
    grown = chat(SYSTEM, "My order is late.", "Sorry.", "What now?", "Late by a week.", "And now?")
    seen = replace(located(448, "messages[3]", 2), seen_segment="messages[3]", seen_char_offset=9)
    assert explain(history, grown, seen) == Explanation("hit", "messages[3]", 9, recomputed_tokens=0,
                                                        source="engine")
    edited = chat(SYSTEM[:300] + "Q" + SYSTEM[301:], "My order is late.", "Sorry.", "What now?")
    seen = replace(located(64, "system", 270), seen_segment="system", seen_char_offset=300)
    explanation = explain(history, edited, seen)
    assert (explanation.reason, explanation.segment, explanation.char_offset) == ("system_changed", "system", 300)
    short = CacheReport("cold", 0, 40, 3, "system", 0, page_size=16, seen_tokens=12, seen_segment="system",
                        seen_char_offset=23)
    explanation = explain(TenantHistory(), chat("Be brief, be kind. Answer in French.", "Hi"), short)
    assert (explanation.reason, explanation.segment, explanation.char_offset) == ("below_page", "system", 23)


def test_a_conversation_that_re_sends_its_history_compacted_changed_its_messages():
    """The conversation's previous turn sent other messages where this one sends a summary: not a new turn (a hit)
    though the divergence lies among the trailing user messages; another conversation's opening is."""
    history = TenantHistory()
    earlier = chat(SYSTEM, "My order is late.", "Sorry.", "What now?", "Let me check.", "Any news?")
    history.add(chat_segments(earlier), 500, request_id="turn-2")
    compacted = chat(SYSTEM, "Summary: the order is late; we are checking.")
    compacted["messages"].append({"role": "user", "content": "Any news?"})
    segments = chat_segments(compacted)
    link = ConversationLink("c", "explicit", 3, parent_request_id="turn-2")
    engine = replace(located(96, "messages[1]", 0), seen_segment="messages[1]", seen_char_offset=0)
    explanation = explain_located(engine, segments, history.nearest(segments), history, link)
    assert (explanation.reason, explanation.segment, explanation.char_offset) == ("messages_changed", "messages[1]", 0)
    other = explain_located(engine, segments, history.nearest(segments), history, None)
    assert other.reason == "hit"


def test_matching_only_the_template_opening_uses_the_history_to_say_why():
    history = TenantHistory()
    first = explain(history, chat(SYSTEM, "Hi"), CacheReport("cold", 0, 500, 3, "system", 0))
    assert (first.reason, first.segment, first.char_offset) == ("new_prefix", "system", 0)  # as the engine said
    unrelated = explain(history, chat("Translate into French.", "Good day"), located(3, "system", 0, miss="cold"))
    assert (unrelated.reason, unrelated.segment, unrelated.char_offset) == ("new_prefix", "system", 0)
    again = explain(history, chat(SYSTEM, "Hi"), located(3, "system", 0, miss="cold"))
    assert (again.reason, again.recomputed_tokens) == ("evicted", 497)


def test_a_line_prepended_is_not_new_prefix_when_a_newer_unlike_request_came_between():
    history = TenantHistory()
    history.add(chat_segments(chat(SYSTEM, "Hi")), 500)
    history.add(chat_segments(chat(SYSTEM[:-10] + "XX EDIT XX" + SYSTEM[-10:], "Hi")), 500)
    dated = chat("Now: 1999-01-01.\n" + SYSTEM, "Hi")
    explanation = explain(history, dated, located(3, "system", 0, miss="cold"))
    assert (explanation.reason, explanation.segment, explanation.char_offset) == ("system_changed", "system", 0)
    assert explanation.source == "engine"


def test_engines_without_the_report_keep_the_history_method():
    assert not engine_locates(CacheReport("partial", 10, 100))
    assert engine_locates(CacheReport("partial", 10, 100, 3, "system", 5))


def test_the_local_engine_adapter_reads_the_report_headers():
    report = adapter_for("local_engine").cache_report(httpx.Headers({
        "x-prefix-cache-matched-tokens": "175", "x-prefix-cache-prompt-tokens": "560", "x-prefix-cache-miss": "partial",
        "x-prefix-cache-template-tokens": "3", "x-prefix-cache-divergence-segment": "messages[2]",
        "x-prefix-cache-divergence-offset": "561", "x-prefix-cache-ttft-ms": "812.5",
    }))
    assert (report.template_tokens, report.divergence_segment, report.divergence_char_offset, report.ttft_ms) == (
        3, "messages[2]", 561, 812.5)
    odd = adapter_for("local_engine").cache_report(httpx.Headers({
        "x-prefix-cache-divergence-segment": "<script>", "x-prefix-cache-ttft-ms": "nan"}))
    assert (odd.divergence_segment, odd.ttft_ms) == (None, None)


def test_uplift_counts_only_what_matched_beyond_the_template_opening():
    job = UpliftJob("chat.completions", {}, "salt", "http://x/v1/cache/match", httpx.Headers(), 120, template_tokens=3)
    assert (uplift_gain(job, 0), uplift_gain(job, 3), uplift_gain(job, 50), uplift_gain(job, 200)) == (117, 117, 70, 0)
    no_opening = UpliftJob("chat.completions", {}, "salt", "http://x/v1/cache/match", httpx.Headers(), 3,
                           template_tokens=3)
    assert uplift_gain(no_opening, 0) == 0


def test_the_gateway_labels_a_tenant_s_namespace_as_the_engine_does():
    from gateway.tenancy import SaltDeriver, namespace_label
    from local_engine.cache.tree_views import namespace_label as engine_label

    salts = SaltDeriver("server-secret")
    salt = salts.salt_for("acme")
    assert salts.label_for("acme") == namespace_label(salt) == engine_label(salt)
    assert namespace_label("") == engine_label("") == "default"
