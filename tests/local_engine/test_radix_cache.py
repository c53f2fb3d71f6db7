"""RadixCache behaviours named in the design, one at a time, with check_integrity() after every step."""

from __future__ import annotations

import pytest
import torch

from local_engine.cache import MissKind, NoPrefixCache, RadixCache, RadixCacheConfig, SlotAllocator


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_cache(capacity=64, **config):
    clock = Clock()
    allocator = SlotAllocator(capacity)
    return RadixCache(RadixCacheConfig(**config), allocator, clock=clock), allocator, clock


def store(cache, allocator, namespace, tokens):
    """Insert `tokens` the way the engine does: fresh slots, duplicates and the unaligned tail freed."""
    slots = allocator.alloc(len(tokens))
    if slots is None:
        cache.evict(len(tokens) - allocator.num_free)
        slots = allocator.alloc(len(tokens))
    result = cache.insert(namespace, list(tokens), slots)
    allocator.free(slots[: result.num_cached_tokens])
    allocator.free(slots[result.num_stored_tokens :])
    cache.check_integrity()
    return result


def test_match_serves_all_but_the_last_token_and_reports_hit():
    cache, allocator, _ = make_cache()
    store(cache, allocator, "a", [1, 2, 3, 4, 5])
    result = cache.match("a", [1, 2, 3, 4, 5])
    assert result.matched_tokens == 4
    assert result.miss_kind is MissKind.HIT
    longer = cache.match("a", [1, 2, 3, 4, 5, 6, 7])
    assert longer.matched_tokens == 5 and longer.miss_kind is MissKind.PARTIAL
    cache.check_integrity()


def test_a_match_ending_mid_edge_splits_the_node_and_keeps_slots():
    cache, allocator, _ = make_cache()
    store(cache, allocator, "a", [1, 2, 3, 4, 5, 6])
    whole = cache.match("a", [1, 2, 3, 4, 5, 6, 7]).slots
    partial = cache.match("a", [1, 2, 3, 9])
    assert partial.matched_tokens == 3
    assert torch.equal(partial.slots, whole[:3])
    assert cache.stats().num_nodes == 2
    cache.check_integrity()


def test_insert_reports_what_was_already_cached():
    cache, allocator, _ = make_cache()
    store(cache, allocator, "a", [1, 2, 3])
    result = store(cache, allocator, "a", [1, 2, 3, 4, 5])
    assert result.num_cached_tokens == 3 and result.num_stored_tokens == 5
    assert cache.cached_tokens == 5


def test_namespaces_never_share_nodes():
    cache, allocator, _ = make_cache()
    store(cache, allocator, "tenant-a", [1, 2, 3, 4])
    assert cache.match("tenant-b", [1, 2, 3, 4]).matched_tokens == 0
    assert cache.match("tenant-b", [1, 2, 3, 4]).miss_kind is MissKind.COLD
    store(cache, allocator, "tenant-b", [1, 2, 3, 4])
    assert cache.cached_tokens == 8  # stored twice, once per namespace
    cache.check_integrity()


def test_pages_align_matches_and_inserts():
    cache, allocator, _ = make_cache(capacity=128, page_size=16)
    tokens = list(range(40))
    result = store(cache, allocator, "a", tokens)
    assert result.num_stored_tokens == 32  # the 8-token tail is not a full page
    assert cache.match("a", tokens).matched_tokens == 32
    assert cache.match("a", tokens[:20] + [99] * 20).matched_tokens == 16
    assert cache.match("a", tokens[:17]).matched_tokens == 16
    assert cache.match("a", tokens[:16]).matched_tokens == 0  # the last token is always computed
    cache.check_integrity()


def test_locked_prefixes_survive_eviction_and_unlocking_makes_them_evictable():
    cache, allocator, _ = make_cache(capacity=16)
    store(cache, allocator, "a", [1, 2, 3, 4, 5, 6, 7, 8])
    held = cache.match("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    cache.lock(held.node)
    assert cache.protected_tokens == 8
    assert cache.evict(8) == []
    cache.check_integrity()
    cache.unlock(held.node)
    evicted = cache.evict(8)
    assert sum(p.num_tokens for p in evicted) == 8 and allocator.num_free == 16
    cache.check_integrity()


def test_lru_evicts_the_least_recently_used_leaf_first_and_parents_follow():
    cache, allocator, clock = make_cache(capacity=64)
    store(cache, allocator, "a", [1, 1, 1, 1])
    clock.now = 1
    store(cache, allocator, "a", [2, 2, 2, 2])
    clock.now = 2
    cache.match("a", [1, 1, 1, 1, 1])  # touch the older one
    evicted = cache.evict(1)
    assert [p.token_ids for p in evicted] == [(2, 2, 2, 2)]


def test_a_miss_after_eviction_is_reported_evicted_not_cold():
    cache, allocator, _ = make_cache(capacity=8)
    store(cache, allocator, "a", [1, 2, 3, 4, 5, 6])
    store(cache, allocator, "a", [7, 8, 9, 10, 11, 12])  # evicts the first prompt to make room
    result = cache.match("a", [1, 2, 3, 4, 5, 6, 0])
    assert result.matched_tokens == 0
    assert result.miss_kind is MissKind.EVICTED
    assert cache.match("a", [40, 41, 42]).miss_kind is MissKind.COLD


def test_ttl_expires_untouched_prefixes_and_reports_expired():
    cache, allocator, clock = make_cache(ttl_s=10)
    store(cache, allocator, "a", [1, 2, 3, 4])
    clock.now = 5
    assert cache.match("a", [1, 2, 3, 4, 5]).matched_tokens == 4
    clock.now = 16
    result = cache.match("a", [1, 2, 3, 4, 5])
    assert result.matched_tokens == 0 and result.miss_kind is MissKind.EXPIRED
    assert cache.stats().expired_tokens_total == 4
    cache.check_integrity()


def test_dry_run_changes_nothing():
    cache, allocator, _ = make_cache()
    store(cache, allocator, "a", [1, 2, 3, 4, 5, 6])
    before = cache.snapshot(100)
    assert cache.match("a", [1, 2, 3, 9], dry_run=True).matched_tokens == 3
    assert cache.snapshot(100) == before


def test_flush_drops_everything_unlocked():
    cache, allocator, _ = make_cache()
    store(cache, allocator, "a", [1, 2, 3])
    store(cache, allocator, "b", [4, 5, 6])
    assert cache.flush() == 6
    assert allocator.num_free == 64
    cache.check_integrity()


def test_integrity_check_catches_a_leaked_slot():
    cache, allocator, _ = make_cache()
    store(cache, allocator, "a", [1, 2, 3])
    allocator.alloc(1)  # taken and never given to the tree
    with pytest.raises(AssertionError):
        cache.check_integrity()


def test_snapshot_is_bounded_and_hides_namespaces():
    cache, allocator, _ = make_cache(capacity=256)
    for first in range(10):
        store(cache, allocator, "secret-salt", [first, 1, 2])
    snapshot = cache.snapshot(max_nodes=4)
    assert snapshot["truncated"] is True
    assert len(snapshot["namespaces"][0]["root"]["children"]) == 4
    assert "secret-salt" not in str(snapshot)


def test_no_prefix_cache_never_matches_and_keeps_nothing():
    allocator = SlotAllocator(16)
    cache = NoPrefixCache(allocator)
    slots = allocator.alloc(4)
    result = cache.insert("a", [1, 2, 3, 4], slots)
    allocator.free(slots[result.num_cached_tokens :])
    assert cache.match("a", [1, 2, 3, 4, 5]).matched_tokens == 0
    cache.check_integrity()


def test_a_prompt_too_short_to_match_anything_is_not_a_hit():
    cache = RadixCache(RadixCacheConfig(), SlotAllocator(64))
    assert cache.match("", [7]).miss_kind == MissKind.COLD  # its one token is always computed
