"""What the engine reports for the token ledger: how much of a prompt was computed before (`seen_tokens`, token by
token inside a page), what an evicted or expired miss dropped (tier, retention class, idle seconds), and the first
token of each segment of the rendered prompt."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from local_engine.cache import MissKind, RadixCache, RadixCacheConfig, SlotAllocator
from local_engine.cache.seen_index import SeenIndex
from local_engine.prompt.layout import PromptLayout, Span

from .test_radix_cache import Clock, store


def make_cache(capacity=64, **config):
    clock = Clock()
    allocator = SlotAllocator(capacity)
    return RadixCache(RadixCacheConfig(**config), allocator, clock=clock), allocator, clock


def test_seen_tokens_count_a_shared_opening_shorter_than_a_page():
    cache, allocator, _ = make_cache(page_size=16)
    first = list(range(100, 140))
    store(cache, allocator, "a", first)
    other = first[:12] + list(range(500, 530))
    result = cache.match("a", other)
    assert (result.matched_tokens, result.seen_tokens, result.miss_kind) == (0, 12, MissKind.COLD)
    longer = cache.match("a", first[:35] + [7, 7, 7])
    assert (longer.matched_tokens, longer.seen_tokens) == (32, 35)
    assert cache.match("b", first).seen_tokens == 0  # another namespace saw nothing


def test_seen_tokens_outlive_the_cached_kv():
    cache, allocator, _ = make_cache(capacity=8)
    store(cache, allocator, "a", [1, 2, 3, 4, 5, 6])
    store(cache, allocator, "a", [7, 8, 9, 10, 11, 12])  # evicts the first prompt
    result = cache.match("a", [1, 2, 3, 4, 5, 6, 0])
    assert (result.matched_tokens, result.seen_tokens, result.miss_kind) == (0, 6, MissKind.EVICTED)
    assert result.dropped["tier"] == "device" and result.dropped["kind"] == "evicted"


def test_an_expired_miss_says_its_retention_class_and_idle_time():
    cache, allocator, clock = make_cache(ttl_s=10)
    store(cache, allocator, "a", [1, 2, 3, 4])
    clock.now = 16
    result = cache.match("a", [1, 2, 3, 4, 5])
    assert result.miss_kind is MissKind.EXPIRED
    assert result.dropped == {"kind": "expired", "tier": "device", "retention": "default", "idle_s": 16.0}
    assert cache.match("a", [9, 9, 9]).dropped is None  # a cold miss: nothing was dropped


def test_remembered_answers_count_as_seen_without_being_cached():
    cache, _, _ = make_cache(page_size=4)
    cache.remember_seen("a", [1, 2, 3, 4, 5, 6])
    result = cache.match("a", [1, 2, 3, 4, 5, 6, 7, 8])
    assert (result.matched_tokens, result.seen_tokens) == (0, 6)


def test_the_seen_index_is_bounded():
    index = SeenIndex(capacity=8, page_size=2)  # hashed by pages of MIN_PAGE_TOKENS
    for start in range(0, 400, 40):
        index.remember("a", list(range(start, start + 40)))
    assert len(index) <= 8
    assert index.seen_tokens("a", list(range(360, 400))) == 40
    assert index.seen_tokens("a", list(range(0, 40))) == 0  # forgotten: least recently used first


def test_segment_starts_give_each_part_first_token():
    # "<s>sys: Be kind.</s><u>Hi</u>": the system text starts at character 8, the user's at 22.
    layout = PromptLayout(
        spans=(Span("system", 8, 16), Span("messages[1]", 22, 24), Span("messages[1]", 25, 30, 3)),
        token_offsets=((0, 3), (3, 8), (8, 11), (11, 16), (16, 22), (22, 24), (24, 25), (25, 30)),
    )
    assert layout.segment_starts() == (("system", 2), ("messages[1]", 5))


@settings(deadline=None, max_examples=200)
@given(
    st.integers(1, 8),
    st.lists(st.lists(st.integers(0, 3), max_size=40), min_size=1, max_size=4),
    st.lists(st.integers(0, 3), max_size=40),
)
def test_seen_tokens_are_the_longest_prefix_shared_with_a_remembered_sequence(page_size, remembered, prompt):
    index = SeenIndex(capacity=10_000, page_size=page_size)
    for tokens in remembered:
        index.remember("a", tokens)
    truth = max(_shared(tokens, prompt) for tokens in remembered)
    seen = index.seen_tokens("a", prompt)
    # Per-token fingerprints are 16 bits: a collision can only lengthen the match inside the page where it ends.
    stride = index.page_size  # page_size or MIN_PAGE_TOKENS, whichever is longer
    assert truth <= seen < truth - truth % stride + stride


def _shared(a: list[int], b: list[int]) -> int:
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count
