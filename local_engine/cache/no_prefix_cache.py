"""NoPrefixCache: the prefix-cache interface with nothing ever cached, the baseline for A/B runs."""

from __future__ import annotations

import torch

from local_engine.cache.slot_allocator import SlotAllocator
from local_engine.cache.tiers.store import TierCounters
from local_engine.cache.tree_views import CacheStats
from local_engine.cache.types import EvictedPrefix, InsertResult, MatchResult, MissKind

_NO_SLOTS = torch.empty(0, dtype=torch.int64)


class NoPrefixCache:
    """Implements `local_engine.cache.protocol.PrefixCache`: matches nothing, stores nothing, has no lower tiers."""

    page_size = 1
    tiers = None

    def __init__(self, allocator: SlotAllocator) -> None:
        self.allocator = allocator
        self.evictable_tokens = 0
        self.protected_tokens = 0
        self.evicted_tokens_total = 0
        self.expired_tokens_total = 0

    def max_matchable_tokens(self, num_prompt_tokens: int) -> int:
        return 0

    def match(
        self, namespace: str, token_ids: list[int], *, dry_run: bool = False, retention: str | None = None
    ) -> MatchResult:
        return MatchResult(_NO_SLOTS, 0, len(token_ids), MissKind.COLD, None)

    def remember_seen(self, namespace: str, token_ids: list[int]) -> None:
        pass  # nothing is cached, so nothing counts as seen either

    def lock(self, node: object) -> None:
        pass

    def unlock(self, node: object) -> None:
        pass

    def insert(
        self, namespace: str, token_ids: list[int], slots: torch.Tensor, retention: str | None = None
    ) -> InsertResult:
        # Stores nothing: the caller frees every slot it passed in.
        return InsertResult(num_cached_tokens=0, num_stored_tokens=0)

    def evict(self, num_tokens: int) -> list[EvictedPrefix]:
        return []

    def expire(self) -> list[EvictedPrefix]:
        return []

    def flush(self) -> int:
        return 0

    @property
    def cached_tokens(self) -> int:
        return 0

    def stats(self) -> CacheStats:
        return CacheStats(
            capacity_tokens=self.allocator.num_slots,
            free_tokens=self.allocator.num_free,
            cached_tokens=0,
            evictable_tokens=0,
            protected_tokens=0,
            num_nodes=0,
            num_namespaces=0,
            evicted_tokens_total=0,
            expired_tokens_total=0,
            page_size=1,
            eviction="none",
            ttl_s=None,
        )

    def tier_stats(self) -> dict[str, dict]:
        """The `/v1/cache` "tiers" object: only the device tier, holding nothing."""
        stats = {}
        for name in ("device", "host", "disk"):
            device = name == "device"
            stats[name] = {
                "enabled": device,
                "capacity_tokens": self.allocator.num_slots if device else 0,
                "cached_tokens": 0,
                "free_tokens": self.allocator.num_free if device else 0,
                "evictable_tokens": 0,
                "protected_tokens": 0,
                "capacity_bytes": 0,
                **TierCounters().as_dict(),
                "corrupt_files_total": 0,
            }
        return stats

    def snapshot(self, max_nodes: int) -> dict:
        return {"namespaces": [], "truncated": False}

    def check_integrity(self, num_slots_outside_tree: int = 0) -> None:
        free = self.allocator.num_free
        assert free + num_slots_outside_tree == self.allocator.num_slots, "slots leaked outside the baseline cache"
