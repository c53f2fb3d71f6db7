"""RadixCache and NoPrefixCache both implement the declared PrefixCache interface, with the same signatures."""

from __future__ import annotations

import inspect

import pytest

from local_engine.cache import NoPrefixCache, PrefixCache, RadixCache, RadixCacheConfig, SlotAllocator
from local_engine.cache.tiers.movement import TierMovement


def members(cls: type) -> dict[str, object]:
    """Public methods and properties of `cls`, and its annotated attributes (as None)."""
    declared = {name: None for name in getattr(cls, "__annotations__", {})}
    return declared | {name: value for name, value in vars(cls).items() if not name.startswith("_")}


def parameters(function) -> list[tuple]:
    """Names, kinds and defaults of a function's parameters (annotations may be spelled differently)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def implementations():
    allocator = SlotAllocator(64)
    return [RadixCache(RadixCacheConfig(), allocator), NoPrefixCache(SlotAllocator(64))]


@pytest.mark.parametrize("cache", implementations(), ids=["RadixCache", "NoPrefixCache"])
def test_both_caches_implement_the_protocol(cache):
    assert isinstance(cache, PrefixCache)
    for name, declared in members(PrefixCache).items():
        assert hasattr(cache, name), f"{type(cache).__name__} lacks {name}"
        if inspect.isfunction(declared):
            assert parameters(getattr(type(cache), name)) == parameters(declared), name


@pytest.mark.parametrize("cache", implementations(), ids=["RadixCache", "NoPrefixCache"])
def test_the_protocol_s_calls_behave_on_both(cache):
    slots = cache.allocator.alloc(9)
    tokens = list(range(1, 10))
    result = cache.insert("ns", tokens, slots)
    cache.allocator.free(slots[: result.num_cached_tokens])
    cache.allocator.free(slots[result.num_stored_tokens :])
    match = cache.match("ns", tokens + [99])
    cache.lock(match.node)
    cache.check_integrity()
    cache.unlock(match.node)
    cache.evict(4)
    cache.expire()
    cache.flush()
    cache.check_integrity()
    assert cache.cached_tokens == cache.evictable_tokens + cache.protected_tokens == 0
    assert set(cache.tier_stats()) == {"device", "host", "disk"}
    assert cache.snapshot(10)["namespaces"] == []


def test_the_radix_cache_s_public_surface_is_the_protocol_and_its_tier_movement():
    # Everything else (node structure, counts, the ghost index) is the RadixTree's, reached only by the cache and
    # TierMovement.
    declared = set(members(PrefixCache)) | {"config", "allocator", "events"}
    public = {name for name in dir(RadixCache(RadixCacheConfig(), SlotAllocator(8))) if not name.startswith("_")}
    assert public == declared
    assert isinstance(RadixCache(RadixCacheConfig(), SlotAllocator(8)).tiers, TierMovement)
    assert NoPrefixCache(SlotAllocator(8)).tiers is None
