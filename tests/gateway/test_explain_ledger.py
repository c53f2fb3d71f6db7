"""The token ledger from an engine report: every part, and that the parts add up whatever the report says."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from db.ledger import LOST_CAUSES
from gateway.conversations.link import AnswerRewrite, ConversationLink
from gateway.explain.ledger import (
    Routing,
    changed_segment_unsent,
    evicted_tier,
    sent_before_segment,
    token_ledger,
    unexplained_ledger,
    withheld_by_api,
)
from gateway.explain.reasons import Explanation
from gateway.upstreams.base import CacheReport
from gateway.upstreams.tiers import TierSplit


def report(prompt: int, matched: int, seen: int, page: int = 16, **extra) -> CacheReport:
    return CacheReport(
        prompt_tokens=prompt, matched_tokens=matched, seen_tokens=seen, page_size=page, template_tokens=3, **extra
    )


def test_a_grown_conversation_is_cached_and_new():
    ledger = token_ledger(report(100, 64, 70), Explanation("hit"))
    assert ledger is not None and ledger.adds_up()
    assert (ledger.cached_tokens, ledger.new_tokens, dict(ledger.lost)) == (64, 30, {"page_alignment": 6})
    assert ledger.eligible_hit_rate == 64 / 70


def test_a_shared_opening_shorter_than_a_page_is_page_alignment():
    ledger = token_ledger(report(40, 0, 12), Explanation("below_page"))
    assert (ledger.cached_tokens, ledger.new_tokens, dict(ledger.lost)) == (0, 28, {"page_alignment": 12})


def test_the_last_token_rule_is_page_alignment():
    ledger = token_ledger(report(33, 32, 33), Explanation("hit"))  # the same prompt again: 32 of 33 matchable
    assert (ledger.cached_tokens, ledger.new_tokens, dict(ledger.lost)) == (32, 0, {"page_alignment": 1})


def test_evicted_tokens_are_lost_with_the_tier_they_were_held_in():
    engine = report(100, 16, 90, miss_kind="evicted", dropped_tier="host")
    ledger = token_ledger(engine, Explanation("evicted"))
    assert dict(ledger.lost) == {"evicted": 64, "page_alignment": 10} and ledger.new_tokens == 10
    assert evicted_tier(engine, ledger) == "host"


def test_expired_tokens_are_lost_to_expiry():
    ledger = token_ledger(report(50, 0, 50, miss_kind="expired", dropped_tier="device"), Explanation("expired"))
    assert dict(ledger.lost) == {"expired": 48, "page_alignment": 2} and ledger.new_tokens == 0


def test_a_content_change_loses_to_its_cause():
    """The change at token 60 broke the page from 48: without it that page would have matched, so its tokens are
    lost to the change, not to page alignment."""
    ledger = token_ledger(report(100, 32, 60), Explanation("system_changed", "system", 40))
    assert dict(ledger.lost) == {"system_changed": 28} and ledger.new_tokens == 40


def test_an_answer_re_sent_truncated_loses_the_page_it_broke_to_the_rewrite():
    """The previous answer re-sent cut short at token 250: nothing after it was sent before (new), and the page the
    cut broke (240..250) is lost to the rewrite; re-sent whole, the same prompt only adds (page alignment)."""
    starts = (("system", 3), ("messages[1]", 200), ("messages[2]", 230), ("messages[3]", 250))
    link = ConversationLink("c", "content", 2, "r1", 1.0, 4, AnswerRewrite("truncated", "messages[2]", 3, 24))
    engine = report(265, 240, 250, segment_starts=starts)
    ledger = token_ledger(engine, Explanation("answer_rewritten", "messages[2]", 24), conversation=link)
    assert dict(ledger.lost) == {"answer_rewritten": 10} and ledger.new_tokens == 15 and ledger.adds_up()
    whole = token_ledger(engine, Explanation("hit"))
    assert dict(whole.lost) == {"page_alignment": 10} and whole.new_tokens == 15
    # Its reasoning stripped: the answer differs from its second character (token 240, a page boundary); what is
    # re-sent up to 252 stands where the returned answer went on.
    stripped = ConversationLink("c", "content", 2, "r1", 1.0, 4,
                                AnswerRewrite("reasoning_stripped", "messages[2]", 3, 1))
    starts = (("system", 3), ("messages[1]", 200), ("messages[2]", 238), ("messages[3]", 252))
    ledger = token_ledger(report(267, 240, 240, segment_starts=starts), Explanation("answer_rewritten",
                          "messages[2]", 1), conversation=stripped)
    assert dict(ledger.lost) == {"answer_rewritten": 12} and ledger.new_tokens == 15


def test_what_the_earlier_request_sent_after_a_change_is_lost_to_the_change_not_new():
    """A timestamp atop the system prompt: the messages after it had been sent before, in the same places; they are
    computed again because of the timestamp (`volatile_value`), and only the new turn is new."""
    names = ["model", "system", "messages[1]", "messages[2]", "messages[3]"]
    starts = (("system", 3), ("messages[1]", 60), ("messages[2]", 80), ("messages[3]", 100))
    engine = report(120, 16, 20, segment_starts=starts)
    earlier, current = [1, 2, 3, 4], [1, 9, 3, 4, 5]  # the system prompt differs; messages[3] is the new turn
    assert sent_before_segment(current, earlier) == 4
    ledger = token_ledger(engine, Explanation("volatile_value", "system", 14), segment_names=names,
                          sent_before_segment=4)
    assert ledger.adds_up() and ledger.new_tokens == 20
    assert dict(ledger.lost) == {"volatile_value": 80, "page_alignment": 4}
    # A reason that is not a content change keeps the engine's count.
    other_model = token_ledger(engine, Explanation("model_changed"), segment_names=names, sent_before_segment=4)
    assert other_model.new_tokens == 100
    assert sent_before_segment([1, 2, 3], [1, 2]) is None  # it only adds to the earlier request


def test_computed_before_but_gone_without_a_trace_is_evicted():
    ledger = token_ledger(report(100, 0, 64), Explanation("new_prefix"))
    assert dict(ledger.lost) == {"evicted": 64}


def test_another_replica_predicted_to_hold_more_is_routed_away():
    ledger = token_ledger(report(100, 16, 80), Explanation("evicted"), routing=Routing(16, 64))
    assert dict(ledger.lost) == {"routed_away": 64}


def test_the_previous_turn_answered_on_another_replica_is_routed_away():
    """A round robin predicts nothing; the conversation says where its previous turn was computed."""
    link = ConversationLink("c", "content", 2, "r1", 1.0, new_from_segment=4, parent_replica="http://a",
                            parent_computed_tokens=250)
    routing = Routing().with_previous_turn(link, "http://b")
    assert routing.best_other_tokens == 250
    names = ["model", "system", "messages[1]", "messages[2]", "messages[3]"]
    starts = (("system", 3), ("messages[1]", 200), ("messages[2]", 230), ("messages[3]", 253))
    ledger = token_ledger(report(268, 0, 3, segment_starts=starts), Explanation("evicted"), routing=routing,
                          conversation=link, segment_names=names)
    assert dict(ledger.lost) == {"routed_away": 240, "page_alignment": 13} and ledger.new_tokens == 15
    assert Routing().with_previous_turn(link, "http://a") == Routing()  # the same replica: no prediction
    rewritten = ConversationLink("c", "content", 2, "r1", 1.0, 4, AnswerRewrite("whitespace", "messages[2]", 3, 5),
                                 parent_replica="http://a", parent_computed_tokens=250)
    assert Routing().with_previous_turn(rewritten, "http://b") == Routing()  # not all of it re-sent as computed


def test_a_rewritten_answer_counts_the_whole_answer_as_sent_before():
    starts = (("system", 3), ("messages[1]", 20), ("messages[2]", 30), ("messages[3]", 70))
    link = ConversationLink("c", "content", 2, "r1", 1.0, 4, AnswerRewrite("whitespace", "messages[2]", 3, 12))
    engine = report(90, 32, 41, segment_starts=starts)
    ledger = token_ledger(engine, Explanation("answer_rewritten", "messages[2]", 12), conversation=link)
    assert dict(ledger.lost) == {"answer_rewritten": 32, "page_alignment": 6} and ledger.new_tokens == 20
    without_link = token_ledger(engine, Explanation("answer_rewritten", "messages[2]", 12))
    assert without_link == ledger


def test_a_later_turn_counts_its_parent_s_prompt_and_answer_as_sent_before():
    names = ["model", "system", "messages[1]", "messages[2]", "messages[3]"]
    starts = (("system", 3), ("messages[1]", 20), ("messages[2]", 30), ("messages[3]", 70))
    link = ConversationLink("c", "content", 2, "r1", 1.0, new_from_segment=4)
    engine = report(90, 16, 20, segment_starts=starts)  # the system prompt changed at token 20
    ledger = token_ledger(engine, Explanation("system_changed", "system", 50), conversation=link, segment_names=names)
    assert dict(ledger.lost) == {"system_changed": 48, "page_alignment": 6} and ledger.new_tokens == 20
    # Computed up to the answer's end: the engine's count stands (the template before the new turn is new).
    grown = token_ledger(report(90, 64, 66, segment_starts=starts), Explanation("hit"), conversation=link,
                         segment_names=names)
    assert dict(grown.lost) == {"page_alignment": 2} and grown.new_tokens == 24


def test_cached_by_tier_is_the_engine_split():
    ledger = token_ledger(report(100, 64, 64), Explanation("hit"), tiers=TierSplit(48, 16, 0))
    assert ledger.cached_by_tier == {"device": 48, "host": 16, "disk": 0} and ledger.adds_up()


def test_upstreams_that_report_less_leave_the_rest_unknown():
    assert token_ledger(CacheReport(prompt_tokens=100)).record_fields()["unknown_tokens"] == 100
    nothing = unexplained_ledger(100, None)
    assert nothing.record_fields() == {"new_tokens": None, "unknown_tokens": 100,
                                       **{f"lost_{cause}_tokens": None for cause in LOST_CAUSES}}
    cached = token_ledger(CacheReport(prompt_tokens=100, matched_tokens=40))
    assert (cached.cached_tokens, cached.new_tokens, cached.unknown_tokens, cached.adds_up()) == (40, None, 60, True)
    assert token_ledger(CacheReport()) is None


REASONS = st.sampled_from(["hit", "below_page", "new_prefix", "evicted", "expired", *LOST_CAUSES])


@st.composite
def engine_reports(draw) -> tuple[CacheReport, Explanation, ConversationLink | None, Routing | None]:
    """Arbitrary (even inconsistent) engine reports and conversations: the ledger must add up whatever they say."""
    prompt = draw(st.integers(0, 3000))
    page = draw(st.integers(1, 64))
    matched = draw(st.integers(0, prompt + 5))
    seen = draw(st.one_of(st.none(), st.integers(0, prompt + 50)))
    names = [f"messages[{i}]" for i in range(draw(st.integers(0, 6)))]
    starts = tuple(sorted((name, draw(st.integers(0, prompt + 10))) for name in names))
    engine = CacheReport(
        prompt_tokens=prompt, matched_tokens=draw(st.one_of(st.none(), st.just(matched))), page_size=page,
        seen_tokens=seen, segment_starts=starts or None,
        miss_kind=draw(st.sampled_from([None, "hit", "partial", "cold", "evicted", "expired"])),
        dropped_tier=draw(st.sampled_from([None, "device", "host", "disk"])),
    )
    link = None
    if names and draw(st.booleans()):
        index = draw(st.integers(0, len(names) - 1))
        rewrite = AnswerRewrite("whitespace", names[index], index + 1, draw(st.integers(0, 500)))
        link = ConversationLink("c", "content", 2, "r", 1.0, index + 2, draw(st.sampled_from([None, rewrite])))
    routing = draw(st.one_of(st.none(), st.builds(Routing, st.integers(0, 4000), st.integers(0, 4000))))
    reason = draw(REASONS)
    segment = draw(st.sampled_from([None, *names]))
    return engine, Explanation(reason, segment, 0 if segment else None), link, routing


@settings(deadline=None, max_examples=300)
@given(engine_reports())
def test_the_ledger_adds_up_on_arbitrary_reports_and_conversations(case):
    engine, explanation, link, routing = case
    ledger = token_ledger(engine, explanation, conversation=link, routing=routing)
    assert ledger is not None and ledger.adds_up()
    assert ledger.prompt_tokens == engine.prompt_tokens
    if engine.matched_tokens is not None and ledger.new_tokens is not None:
        assert ledger.cached_tokens == min(engine.matched_tokens, engine.prompt_tokens)
        assert set(ledger.lost) <= set(LOST_CAUSES)


def test_what_the_api_did_not_read_is_lost_to_the_cache_scope():
    """The engine matched 96 tokens; the Messages API read none (its breakpoint was below the minimum): the ledger
    made on the engine's match moves them to `cache_scope`, and the tier split follows what was read."""
    ledger = token_ledger(report(120, 96, 100), Explanation("hit"))
    withheld = withheld_by_api(ledger, 96, TierSplit(0, 0, 0))
    assert withheld.adds_up() and withheld.cached_tokens == 0 and withheld.cached_by_tier == {"device": 0, "host": 0,
                                                                                              "disk": 0}
    assert dict(withheld.lost) == {"page_alignment": 4, "cache_scope": 96} and withheld.new_tokens == 20
    assert withheld_by_api(ledger, 0, None) == ledger


def test_a_changed_segment_s_text_its_earlier_version_did_not_have_is_new_not_lost():
    """The system prompt tripled: its first copy was computed before (seen to token 254), the two copies after it
    were never sent (new); the user message after it, sent before at its place, is lost to the change."""
    text = "Grow test: a concise assistant for the Zorblax project. Keep answers tiny. " * 12
    names = ["model", "system", "messages[1]"]
    engine = report(737, 240, 254, segment_starts=(("system", 3), ("messages[1]", 733)))
    unsent = changed_segment_unsent(engine, "system", text * 3, text)
    assert unsent == 733 - 254
    ledger = token_ledger(engine, Explanation("system_changed", "system", len(text)), segment_names=names,
                          sent_before_segment=3, unsent_tokens=unsent)
    assert ledger.adds_up() and ledger.new_tokens == 479
    assert dict(ledger.lost) == {"system_changed": 17, "page_alignment": 1}
    # A value replaced in place: only its own characters are new.
    dated = text.replace("Zorblax", "Quuxbar", 1)
    edited = changed_segment_unsent(replace(engine, seen_tokens=20, segment_starts=(("system", 3),
                                                                                    ("messages[1]", 250))),
                                    "system", dated, text)
    assert 0 < edited <= 3
    assert changed_segment_unsent(engine, "tools", text * 3, text) == 0  # a segment the engine does not place
