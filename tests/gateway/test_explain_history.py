"""The per-tenant history: nearest earlier request by longest leading run, bounded, texts kept within a budget."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.explain.history import HistoryIndex, TenantHistory
from gateway.explain.segments import PromptSegments, Segment, chat_segments


def request(*contents, model="m"):
    messages = [{"role": "user", "content": c} for c in contents]
    return chat_segments({"model": model, "messages": messages})


def test_empty_history_has_no_nearest():
    assert TenantHistory().nearest(request("a")) is None


def test_nearest_shares_the_longest_leading_run_and_the_latest_wins_ties():
    history = TenantHistory()
    short = history.add(request("a", "x"))
    longer = history.add(request("a", "b", "c"))
    later_short = history.add(request("a", "y"))
    found = history.nearest(request("a", "b", "z"))
    assert found.entry is longer and found.shared == 3 and not found.other_model  # model, a, b
    tie = history.nearest(request("a", "q"))
    assert tie.entry is later_short and tie.shared == 2
    assert short is not later_short


def test_same_model_only_when_nothing_else_is_shared():
    history = TenantHistory()
    entry = history.add(request("a"))
    found = history.nearest(request("b"))
    assert found.entry is entry and found.shared == 1 and not found.other_model


def test_the_same_prompt_under_another_model_is_found():
    history = TenantHistory()
    history.add(request("unrelated", model="m2"))
    entry = history.add(request("a", "b"))
    found = history.nearest(request("a", "b", model="m2"))
    assert found.entry is entry and found.other_model and found.shared == 2


def test_capacity_forgets_the_oldest_but_keeps_prefixes_shared_by_newer_requests():
    history = TenantHistory(capacity=2)
    history.add(request("old", "x"))
    second = history.add(request("a", "b"))
    third = history.add(request("a", "c"))
    assert len(history) == 2
    assert history.nearest(request("old", "x")).shared == 1  # only the model is left in common
    assert history.nearest(request("a", "b")).entry is second
    assert history.nearest(request("a")).entry is third


def test_texts_are_kept_once_and_released_with_the_last_request_holding_them():
    history = TenantHistory(capacity=2)
    first = request("shared text", "one")
    history.add(first)
    history.add(request("shared text", "two"))
    shared_digest = first.segments[1].digest
    assert history.text(shared_digest) == "shared text"
    history.add(request("other", "three"))
    assert history.text(shared_digest) == "shared text"  # still held by the second request
    history.add(request("other", "four"))
    assert history.text(shared_digest) is None
    assert history.text_chars == len("m") + len("other") + len("three") + len("four")


def test_texts_past_the_budget_are_not_kept():
    history = TenantHistory(text_budget_chars=10)
    prompt = request("a" * 20)
    history.add(prompt)
    assert history.text(prompt.segments[1].digest) is None
    assert history.text(prompt.segments[0].digest) == "m"


def test_index_makes_one_history_per_tenant():
    index = HistoryIndex()
    assert index.for_tenant("a", 5) is index.for_tenant("a", 5)
    assert index.for_tenant("a", 5) is not index.for_tenant("b", 5)
    assert index.for_tenant("c", 7).capacity == 7


def synthetic(digests: tuple[int, ...]) -> PromptSegments:
    return PromptSegments(tuple(Segment(f"s{i}", "message", d, str(d)) for i, d in enumerate(digests)), len(digests))


def brute_force_run(history: list[tuple[int, ...]], digests: tuple[int, ...]) -> int:
    best = 0
    for earlier in history:
        run = 0
        while run < min(len(earlier), len(digests)) and earlier[run] == digests[run]:
            run += 1
        best = max(best, run)
    return best


same_model_prompts = st.lists(st.integers(1, 3), min_size=0, max_size=4).map(lambda rest: (0, *rest))


@settings(max_examples=60, deadline=None)
@given(st.lists(same_model_prompts, min_size=1, max_size=25), same_model_prompts, st.integers(1, 6))
def test_index_agrees_with_a_brute_force_search_over_the_last_requests(requests, probe, capacity):
    """One model throughout (digest 0 first): the nearest is the latest of the kept requests sharing the longest run."""
    history = TenantHistory(capacity=capacity)
    for digests in requests:
        history.add(synthetic(digests))
    kept = requests[-capacity:]
    found = history.nearest(synthetic(probe))
    expected = brute_force_run(kept, probe)
    assert found is not None and not found.other_model
    assert found.shared == expected
    latest = [d for d in kept if d[:expected] == probe[:expected]][-1]
    assert found.entry.digests == latest
