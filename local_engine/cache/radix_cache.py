"""RadixCache: the prefix index, the `PrefixCache` the engine uses. A compressed radix tree over token ids per
namespace; node values are slot ids.

The tree never touches K/V bytes itself: it maps token prefixes to KV pool slots (and, with lower tiers, host pool
slots and disk extents), decides what to evict, and gives back what it evicts. The tree's structure and bookkeeping
are RadixTree's; moving copies between tiers (demotion, load-back, cleaning, the disk tier across restarts) is
TierMovement's, reached as `tiers`. Per tier, the tree counts the tokens it holds unlocked (`evictable`) and locked
(`protected`). Callers serialize access (the engine holds one lock around it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from local_engine.cache.block_events import BlockEvents
from local_engine.cache.eviction import eviction_policy
from local_engine.cache.radix_node import RadixNode, child_key, common_prefix_tokens
from local_engine.cache.radix_tree import NO_SLOTS, RadixTree
from local_engine.cache.retention import extend, is_expired
from local_engine.cache.slot_allocator import SlotAllocator
from local_engine.cache.tiers import TierTokens
from local_engine.cache.tiers.movement import TierMovement
from local_engine.cache.tiers.store import DEVICE, TierStore
from local_engine.cache.tree_views import CacheStats, cache_stats, check_tree_integrity, tree_snapshot
from local_engine.cache.types import EvictedPrefix, InsertResult, MatchResult, MissKind

@dataclass(frozen=True)
class RadixCacheConfig:
    page_size: int = 1
    eviction: str = "lru"
    ttl_s: float | None = None  # unlocked prefixes untouched for this long are dropped; None keeps them
    ghost_capacity: int = 65_536  # how many removed prefixes are remembered (by hash) to explain misses

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError("page_size must be at least 1")
        if self.ttl_s is not None and self.ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        eviction_policy(self.eviction)


class RadixCache:
    """Implements `local_engine.cache.protocol.PrefixCache`. `tiers` is the TierStore of the lower tiers (a device-only
    one when None); `clock` gives monotonic seconds for access times and TTLs; `events` announces what each tier holds
    (a BlockEvents of the default block size when None)."""

    def __init__(
        self,
        config: RadixCacheConfig,
        allocator: SlotAllocator,
        clock: Callable[[], float] = time.monotonic,
        tiers: TierStore | None = None,
        events: BlockEvents | None = None,
    ) -> None:
        self.config = config
        self.page_size = config.page_size
        self.allocator = allocator
        self._clock = clock
        store = tiers if tiers is not None else TierStore(device_allocator=allocator)
        # The tree reads the time through `_clock`, so a clock swapped in before anything is stored applies.
        self._tree = RadixTree(config.page_size, eviction_policy(config.eviction), store, lambda: self._clock(),
                               events if events is not None else BlockEvents(), default_ttl_s=config.ttl_s,
                               ghost_capacity=config.ghost_capacity)
        self.tiers = TierMovement(self._tree)
        self.events = self._tree.events  # what each tier holds, as KV-event blocks, for cache-aware routers

    @property
    def evictable_tokens(self) -> int:
        """Device (L1) tokens held by unlocked nodes."""
        return self._tree.evictable[DEVICE]

    @property
    def protected_tokens(self) -> int:
        """Device (L1) tokens held by locked nodes."""
        return self._tree.protected[DEVICE]

    @property
    def cached_tokens(self) -> int:
        """Tokens whose KV is in the device pool (L1)."""
        return self.evictable_tokens + self.protected_tokens

    @property
    def evicted_tokens_total(self) -> int:
        return self._tree.evicted_tokens_total

    @property
    def expired_tokens_total(self) -> int:
        return self._tree.expired_tokens_total

    # ---- lookup -------------------------------------------------------------------------------------------------

    def max_matchable_tokens(self, num_prompt_tokens: int) -> int:
        """The last prompt token is always computed (its logits start the answer); matches are page-aligned."""
        return self._tree.max_matchable_tokens(num_prompt_tokens)

    def match(
        self, namespace: str, token_ids: list[int], *, dry_run: bool = False, retention: str | None = None
    ) -> MatchResult:
        """The longest cached page-aligned prefix of `token_ids` (at most all but the last token) in `namespace`,
        across tiers. `slots` are the device slots of its device part (`tier_tokens.device` tokens, the whole match
        without lower tiers); the rest is loaded back by `tiers.load_back` after locking.

        A match that ends inside an edge splits that node so the matched part can be locked on its own; the matched
        nodes take on `retention`'s lifetime if longer. With `dry_run` nothing changes: no split, no access time, no
        hit count, no expiry. Raises ValueError for an unknown retention class.
        """
        tree = self._tree
        lifetime = None if dry_run else tree.lifetime(retention)
        if not dry_run:
            self.expire()
        limit = tree.max_matchable_tokens(len(token_ids))
        root = tree.roots().get(namespace)
        node, matched, pieces = root, 0, []
        per_tier = [0, 0, 0]
        now = self._clock()
        while root is not None and matched < limit:
            child = node.children.get(child_key(token_ids, matched, self.page_size))
            if child is None:
                break
            same = common_prefix_tokens(child.key, token_ids, matched, limit, self.page_size)
            if same == 0:
                break
            if same < child.num_tokens:
                if dry_run:
                    per_tier[child.tier_index] += same
                    if child.slots is not None:
                        pieces.append(child.slots[:same])
                    matched += same
                    break
                child = tree.split(child, same)
            if not dry_run:
                child.last_access_s = now
                child.hit_count += 1
                extend(child, lifetime)
            per_tier[child.tier_index] += same
            if child.slots is not None:
                pieces.append(child.slots)
            matched += same
            node = child
        slots = torch.cat(pieces) if pieces else NO_SLOTS
        miss_kind = tree.miss_kind(namespace, token_ids, matched, limit)
        locked_node = node if (node is not None and not node.is_root and not dry_run) else None
        tier_tokens = TierTokens(*per_tier) if tree.store.has_lower_tiers else None
        return MatchResult(slots, matched, len(token_ids), miss_kind, locked_node, tier_tokens,
                           seen_tokens=tree.seen.seen_tokens(namespace, token_ids, matched),
                           dropped=self._dropped(namespace, token_ids, matched, miss_kind))

    def _dropped(self, namespace: str, token_ids: list[int], matched: int, miss_kind: MissKind) -> dict | None:
        """For an evicted/expired miss, what the ghost index says was dropped (`DroppedPrefix.as_dict`)."""
        if miss_kind not in (MissKind.EVICTED, MissKind.EXPIRED):
            return None
        found = self._tree.dropped(namespace, token_ids, matched)
        return None if found is None else found.as_dict(self._clock())

    def remember_seen(self, namespace: str, token_ids: list[int]) -> None:
        """Remember `token_ids` as sent in `namespace` (`MatchResult.seen_tokens`) without caching anything."""
        self._tree.seen.remember(namespace, token_ids)

    # ---- reference counts ---------------------------------------------------------------------------------------

    def lock(self, node: RadixNode | None) -> None:
        """Protect `node` and its ancestors from eviction until `unlock(node)`."""
        self._tree.lock(node)

    def unlock(self, node: RadixNode | None) -> None:
        """Undo one `lock(node)`; raises RuntimeError for a node that is not locked."""
        self._tree.unlock(node)

    # ---- insertion ----------------------------------------------------------------------------------------------

    def insert(
        self, namespace: str, token_ids: list[int], slots: torch.Tensor, retention: str | None = None
    ) -> InsertResult:
        """Index `token_ids` (page-aligned part) with their KV in device `slots` (int64 `[len(token_ids)]`).

        The tree takes ownership of the slots it stores. The caller frees its slots in
        `[num_already_cached_before_its_own_match, result.num_cached_tokens)` (another request stored those first)
        and `[result.num_stored_tokens, len(token_ids))` (the unaligned tail). A node on the path whose KV is only in
        a lower tier takes the caller's slots as its device copy (they hold the same KV), so `num_cached_tokens` stops
        where such a node starts. Under write_through, a new node is copied down to the lower tiers at once.
        """
        if slots.numel() != len(token_ids):
            raise ValueError(f"{len(token_ids)} tokens but {slots.numel()} slots")
        tree = self._tree
        lifetime = tree.lifetime(retention)
        tree.seen.remember(namespace, token_ids)
        stored = len(token_ids) - len(token_ids) % self.page_size
        root = tree.root_for(namespace)
        now = self._clock()
        node, position, cached = root, 0, None
        while position < stored:
            child = node.children.get(child_key(token_ids, position, self.page_size))
            if child is None:
                leaf = RadixNode(node, token_ids[position:stored], slots[position:stored].clone(), now)
                leaf.ttl_s, leaf.persistent = lifetime.ttl_s, lifetime.persistent
                node.children[child_key(token_ids, position, self.page_size)] = leaf
                tree.account(leaf, 1)
                if tree.store.write_through:
                    self.tiers.copy_down(leaf, namespace)
                num_cached = position if cached is None else cached
                return InsertResult(num_cached_tokens=num_cached, num_stored_tokens=stored, node=leaf)
            same = common_prefix_tokens(child.key, token_ids, position, stored, self.page_size)
            if same < child.num_tokens:
                child = tree.split(child, same)
            if child.slots is None:
                cached = position if cached is None else cached
                tree.account(child, -1)
                child.slots = slots[position : position + same].clone()
                tree.account(child, 1)
            child.last_access_s = now
            extend(child, lifetime)
            position += same
            node = child
        num_cached = stored if cached is None else cached
        return InsertResult(num_cached_tokens=num_cached, num_stored_tokens=stored, node=node if position else None)

    # ---- removal ------------------------------------------------------------------------------------------------

    def evict(self, num_tokens: int) -> list[EvictedPrefix]:
        """Free at least `num_tokens` device slots from unlocked nodes, by policy (persistent nodes last); fewer only
        if nothing else is evictable. With lower tiers the KV is demoted rather than dropped. Returns the prefixes
        that left the tree."""
        return self.tiers.make_room(DEVICE, num_tokens)

    def expire(self) -> list[EvictedPrefix]:
        """Drop unlocked prefixes idle past their lifetime, from every tier (a no-op while no node has a TTL)."""
        if not self._tree.may_expire:
            return []
        now = self._clock()
        return self._tree.remove_leaves(lambda node: is_expired(node, now), expired=True)

    def flush(self) -> int:
        """Drop every unlocked prefix in every namespace and tier; returns the number of tokens removed."""
        tree = self._tree
        removed = tree.remove_leaves(lambda node: True, expired=False, remember=False)
        tree.forget_removed()
        if not any(tree.protected) and not any(tree.evictable):
            tree.events.cleared()
        return sum(prefix.num_tokens for prefix in removed)

    # ---- introspection ------------------------------------------------------------------------------------------

    def tier_stats(self) -> dict[str, dict]:
        """Per tier (device, host, disk): capacity, occupancy and counters, as the `/v1/cache` "tiers" object."""
        return self.tiers.stats()

    def stats(self) -> CacheStats:
        """Device (L1) occupancy and totals; `tier_stats` has every tier."""
        return cache_stats(self, self._tree.roots())

    def snapshot(self, max_nodes: int) -> dict:
        return tree_snapshot(self._tree.roots(), max_nodes, self._clock())

    def check_integrity(self, num_slots_outside_tree: int = 0) -> None:
        """Raise AssertionError unless the tree invariants hold and free + evictable + protected (+ slots held by
        in-flight requests outside the tree) == capacity."""
        check_tree_integrity(
            roots=self._tree.roots(),
            page_size=self.page_size,
            free_slots=self.allocator.free_slot_ids(),
            capacity=self.allocator.num_slots,
            evictable_tokens=self.evictable_tokens,
            protected_tokens=self.protected_tokens,
            num_slots_outside_tree=num_slots_outside_tree,
        )
        self.tiers.check_integrity(num_slots_outside_tree)
