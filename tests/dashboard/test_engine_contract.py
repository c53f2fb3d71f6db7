"""The engine's real cache views read by the dashboard's client code: a contract test between the two packages.

The dashboard itself never imports the engine; this test does, to pin the JSON shapes the Engine page relies on.
"""

from __future__ import annotations

import pytest

from dashboard.cache_tree import flatten_tree
from dashboard.engine_client import CacheStats, stats_from_payload

torch = pytest.importorskip("torch")
radix = pytest.importorskip("local_engine.cache.radix_cache")
allocator_module = pytest.importorskip("local_engine.cache.slot_allocator")


def test_real_radix_cache_views_are_understood() -> None:
    allocator = allocator_module.SlotAllocator(256)
    cache = radix.RadixCache(radix.RadixCacheConfig(), allocator)
    shared = list(range(100, 140))
    for namespace, tail in (("tenant-a", [1, 2, 3]), ("tenant-a", [4, 5]), ("tenant-b", [6])):
        tokens = shared + tail
        slots = allocator.alloc(len(tokens))
        result = cache.insert(namespace, tokens, slots)
        assert result is not None
    stats = stats_from_payload(cache.stats().as_dict())
    assert isinstance(stats, CacheStats)
    assert stats.capacity_tokens == 256
    assert stats.evictable_tokens + stats.protected_tokens <= stats.used_tokens <= 256
    flat, summaries = flatten_tree(cache.snapshot(max_nodes=100)["namespaces"])
    assert len(summaries) == 2
    assert sum(summary.num_tokens for summary in summaries) == stats.evictable_tokens + stats.protected_tokens
    assert flat.subtree_tokens[0] == sum(summary.num_tokens for summary in summaries)
