"""Helpers for tier tests: a RadixCache over small real pools with host and disk tiers, and KV that encodes where it
belongs (so a test can tell that bytes moved between tiers came back unchanged)."""

from __future__ import annotations

import torch

from local_engine.cache import KVPool, RadixCache, RadixCacheConfig, SlotAllocator
from local_engine.cache.tiers.disk_index import DiskTier
from local_engine.cache.tiers.disk_store import KVLayout
from local_engine.cache.kv_pool import KVPoolConfig
from local_engine.cache.tiers.store import TierStore

POOL_CONFIG = KVPoolConfig(num_layers=2, num_kv_heads=1, head_dim=2, dtype=torch.float32, device=torch.device("cpu"))
LAYOUT = KVLayout("test-model", torch.float32, 1, 2, 1, 2)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def kv_value(namespace: str, path: tuple[int, ...]) -> float:
    """What the KV of the last token of `path` is filled with (an exact float32 integer)."""
    return float(hash((namespace, path)) % (1 << 20))


def fill_kv(pool: KVPool, slots: torch.Tensor, namespace: str, tokens: list[int], start: int = 0) -> None:
    """Write the expected KV of `tokens[start:start + len(slots)]` into `slots`."""
    for offset, slot in enumerate(slots.tolist()):
        value = kv_value(namespace, tuple(tokens[: start + offset + 1]))
        pool.k[:, slot] = value
        pool.v[:, slot] = -value


def assert_kv(pool: KVPool, slots: torch.Tensor, namespace: str, tokens: list[int]) -> None:
    """`slots` hold the KV of `tokens[:len(slots)]`."""
    for position, slot in enumerate(slots.tolist()):
        expected = kv_value(namespace, tuple(tokens[: position + 1]))
        assert pool.k[:, slot].eq(expected).all(), f"token {position}: wrong K"
        assert pool.v[:, slot].eq(-expected).all(), f"token {position}: wrong V"


def tiered_cache(
    device_tokens: int,
    host_tokens: int = 0,
    disk_dir=None,
    disk_tokens: int = 0,
    *,
    write_policy: str = "write_back",
    clock=None,
    page_size: int = 1,
    ttl_s: float | None = None,
    layout: KVLayout = LAYOUT,
) -> RadixCache:
    device = KVPool(POOL_CONFIG, device_tokens)
    allocator = SlotAllocator(device_tokens)
    host_pool = host_allocator = disk = None
    if host_tokens:
        host_pool, host_allocator = KVPool(POOL_CONFIG, host_tokens), SlotAllocator(host_tokens)
    if disk_dir is not None:
        disk = DiskTier(str(disk_dir), layout, disk_tokens * layout.payload_bytes(1))
        disk.open()
    tiers = TierStore(device, allocator, host_pool, host_allocator, disk, write_policy)
    config = RadixCacheConfig(page_size=page_size, ttl_s=ttl_s)
    return RadixCache(config, allocator, clock=clock or FakeClock(), tiers=tiers)


def store(cache: RadixCache, namespace: str, tokens: list[int], retention: str | None = None):
    """Insert `tokens` as a request would (fresh slots with their KV); frees what the tree did not take."""
    slots = cache.allocator.alloc(len(tokens))
    if slots is None:
        cache.evict(len(tokens) - cache.allocator.num_free)
        slots = cache.allocator.alloc(len(tokens))
    assert slots is not None, "no room to store"
    fill_kv(cache.tiers.device_pool, slots, namespace, tokens)
    result = cache.insert(namespace, tokens, slots, retention=retention)
    cache.allocator.free(slots[: result.num_cached_tokens])
    cache.allocator.free(slots[result.num_stored_tokens :])
    return result


def admit(cache: RadixCache, namespace: str, tokens: list[int], retention: str | None = None):
    """Match, lock and load back as admission does; returns (served match, the request's own slots)."""
    from local_engine.cache.tiers.loading import load_back

    match = cache.match(namespace, tokens, retention=retention)
    cache.lock(match.node)
    num_device = match.tier_tokens.device if match.tier_tokens is not None else match.matched_tokens
    slots = cache.allocator.alloc(len(tokens) - num_device)
    if slots is None:
        cache.evict(len(tokens) - num_device - cache.allocator.num_free)
        slots = cache.allocator.alloc(len(tokens) - num_device)
    assert slots is not None, "no room to admit"
    if num_device < match.matched_tokens:
        match = load_back(cache, namespace, tokens, match, slots)
    own = slots[match.matched_tokens - num_device :]
    return match, own


def release(cache: RadixCache, match, own: torch.Tensor) -> None:
    cache.unlock(match.node)
    cache.allocator.free(own)
