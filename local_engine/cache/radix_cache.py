"""RadixCache: the prefix index. A compressed radix tree over token ids per namespace; node values are slot ids.

The tree never touches K/V bytes itself: it maps token prefixes to KV pool slots (and, with lower tiers, host pool
slots and disk extents), decides what to evict, and gives back what it evicts. Moving bytes between tiers is
TierStore's job; which copy to move is `tier_eviction`'s; loading back is `tier_loading`'s. Per tier, the tree counts
the tokens it holds unlocked (`evictable`) and locked (`protected`). Callers serialize access (the engine holds one
lock around it).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from typing import Callable

import torch

from local_engine.cache.tiers import eviction as tier_eviction
from local_engine.cache.eviction import eviction_policy
from local_engine.cache.ghost_index import GhostIndex, prefix_hash
from local_engine.cache.radix_node import RadixNode, child_key, common_prefix_tokens
from local_engine.cache.retention import Lifetime, extend, is_expired, lifetime_of
from local_engine.cache.slot_allocator import SlotAllocator
from local_engine.cache.tiers.integrity import check_tier_integrity
from local_engine.cache.tiers.store import DEVICE, TierStore
from local_engine.cache.tiers import TierTokens
from local_engine.cache.tree_views import CacheStats, cache_stats, check_tree_integrity, tree_snapshot
from local_engine.cache.types import EvictedPrefix, InsertResult, MatchResult, MissKind
from local_engine.cache.block_events import BlockEvents

_NO_SLOTS = torch.empty(0, dtype=torch.int64)


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
    def __init__(
        self,
        config: RadixCacheConfig,
        allocator: SlotAllocator,
        clock: Callable[[], float] = time.monotonic,
        tiers: TierStore | None = None,
    ) -> None:
        self.config = config
        self.page_size = config.page_size
        self.allocator = allocator
        self.tiers = tiers if tiers is not None else TierStore(device_allocator=allocator)
        self._clock = clock
        self._priority = eviction_policy(config.eviction)
        self._roots: dict[str, RadixNode] = {}
        self._ghosts = GhostIndex(config.ghost_capacity)
        self.evictable = [0, 0, 0]  # per tier (device, host, disk): tokens held by unlocked nodes
        self.protected = [0, 0, 0]  # per tier: tokens held by locked nodes
        self.evicted_tokens_total = 0
        self.expired_tokens_total = 0
        self._may_expire = config.ttl_s is not None  # set once any node gets a TTL from a retention class
        self.events = BlockEvents()  # what each tier holds, as KV-event blocks, for cache-aware routers

    @property
    def evictable_tokens(self) -> int:
        """Device (L1) tokens held by unlocked nodes."""
        return self.evictable[DEVICE]

    @property
    def protected_tokens(self) -> int:
        """Device (L1) tokens held by locked nodes."""
        return self.protected[DEVICE]

    def account(self, node: RadixNode, sign: int) -> None:
        """Add (`sign=1`) or take away (`-1`) `node`'s copies from the per-tier counts; call with -1 before changing
        a node's copies or lock state and with +1 after."""
        counts = self.protected if node.lock_ref else self.evictable
        for tier in range(3):
            if node.copy_in(tier) is not None:
                counts[tier] += sign * node.num_tokens
        if sign > 0:
            self.events.accounted(self, node)

    def enable_expiry(self) -> None:
        """A node with a TTL exists (rebuilt from disk, say): `expire` has work to do."""
        self._may_expire = True

    def lifetime(self, retention: str | None) -> Lifetime:
        """Raises ValueError for an unknown retention class."""
        lifetime = lifetime_of(retention, self.config.ttl_s)
        self._may_expire = self._may_expire or lifetime.ttl_s is not None
        return lifetime

    # ---- lookup -------------------------------------------------------------------------------------------------

    def max_matchable_tokens(self, num_prompt_tokens: int) -> int:
        """The last prompt token is always computed (its logits start the answer); matches are page-aligned."""
        limit = max(0, num_prompt_tokens - 1)
        return limit - limit % self.page_size

    def match(
        self, namespace: str, token_ids: list[int], *, dry_run: bool = False, retention: str | None = None
    ) -> MatchResult:
        """The longest cached page-aligned prefix of `token_ids` (at most all but the last token) in `namespace`,
        across tiers. `slots` are the device slots of its device part (`tier_tokens.device` tokens, the whole match
        without lower tiers); the rest is loaded back by `tier_loading.load_back` after locking.

        A match that ends inside an edge splits that node so the matched part can be locked on its own; the matched
        nodes take on `retention`'s lifetime if longer. With `dry_run` nothing changes: no split, no access time, no
        hit count, no expiry. Raises ValueError for an unknown retention class.
        """
        lifetime = None if dry_run else self.lifetime(retention)
        if not dry_run:
            self.expire()
        limit = self.max_matchable_tokens(len(token_ids))
        root = self._roots.get(namespace)
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
                child = self.split(child, same)
            if not dry_run:
                child.last_access_s = now
                child.hit_count += 1
                extend(child, lifetime)
            per_tier[child.tier_index] += same
            if child.slots is not None:
                pieces.append(child.slots)
            matched += same
            node = child
        slots = torch.cat(pieces) if pieces else _NO_SLOTS
        miss_kind = self.miss_kind(namespace, token_ids, matched, limit)
        locked_node = node if (node is not None and not node.is_root and not dry_run) else None
        tier_tokens = TierTokens(*per_tier) if self.tiers.has_lower_tiers else None
        return MatchResult(slots, matched, len(token_ids), miss_kind, locked_node, tier_tokens)

    def miss_kind(self, namespace: str, token_ids: list[int], matched: int, limit: int) -> MissKind:
        if limit == 0:  # a prompt too short to match anything reuses nothing, whatever was cached
            return MissKind.COLD
        if matched >= limit:
            return MissKind.HIT
        removed = self._ghosts.lookup(prefix_hash(namespace, token_ids[: matched + self.page_size]))
        if removed is not None:
            return removed
        return MissKind.PARTIAL if matched else MissKind.COLD

    # ---- reference counts ---------------------------------------------------------------------------------------

    def lock(self, node: RadixNode | None) -> None:
        """Protect `node` and its ancestors from eviction until `unlock(node)`."""
        while node is not None and not node.is_root:
            if node.lock_ref == 0:
                self.account(node, -1)
                node.lock_ref += 1
                self.account(node, 1)
            else:
                node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode | None) -> None:
        while node is not None and not node.is_root:
            if node.lock_ref <= 0:
                raise RuntimeError(f"unlock of node {node.node_id} that is not locked")
            if node.lock_ref == 1:
                self.account(node, -1)
                node.lock_ref -= 1
                self.account(node, 1)
            else:
                node.lock_ref -= 1
            node = node.parent

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
        lifetime = self.lifetime(retention)
        stored = len(token_ids) - len(token_ids) % self.page_size
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = RadixNode(None, [], _NO_SLOTS, self._clock())
        now = self._clock()
        node, position, cached = root, 0, None
        while position < stored:
            child = node.children.get(child_key(token_ids, position, self.page_size))
            if child is None:
                leaf = RadixNode(node, token_ids[position:stored], slots[position:stored].clone(), now)
                leaf.ttl_s, leaf.persistent = lifetime.ttl_s, lifetime.persistent
                node.children[child_key(token_ids, position, self.page_size)] = leaf
                self.account(leaf, 1)
                if self.tiers.write_through:
                    tier_eviction.copy_down(self, leaf, namespace)
                num_cached = position if cached is None else cached
                return InsertResult(num_cached_tokens=num_cached, num_stored_tokens=stored, node=leaf)
            same = common_prefix_tokens(child.key, token_ids, position, stored, self.page_size)
            if same < child.num_tokens:
                child = self.split(child, same)
            if child.slots is None:
                cached = position if cached is None else cached
                self.account(child, -1)
                child.slots = slots[position : position + same].clone()
                self.account(child, 1)
            child.last_access_s = now
            extend(child, lifetime)
            position += same
            node = child
        num_cached = stored if cached is None else cached
        return InsertResult(num_cached_tokens=num_cached, num_stored_tokens=stored, node=node if position else None)

    def split(self, child: RadixNode, num_tokens: int) -> RadixNode:
        """Cut `child`'s edge after `num_tokens`; returns the new upper node, which keeps the child's locks."""
        parent = child.parent
        device = child.slots
        upper = RadixNode(parent, child.key[:num_tokens], None if device is None else device[:num_tokens],
                          child.last_access_s)
        upper.lock_ref = child.lock_ref
        upper.hit_count = child.hit_count
        upper.created_s = child.created_s
        upper.ttl_s, upper.persistent = child.ttl_s, child.persistent
        parent.children[child_key(child.key, 0, self.page_size)] = upper
        self.tiers.split_copies(upper, child, num_tokens)
        child.key = child.key[num_tokens:]
        child.slots = None if device is None else device[num_tokens:]
        child.parent = upper
        upper.children[child_key(child.key, 0, self.page_size)] = child
        return upper

    # ---- removal ------------------------------------------------------------------------------------------------

    def evict(self, num_tokens: int) -> list[EvictedPrefix]:
        """Free at least `num_tokens` device slots from unlocked nodes, by policy (persistent nodes last); fewer only
        if nothing else is evictable. With lower tiers the KV is demoted rather than dropped. Returns the prefixes
        that left the tree."""
        return tier_eviction.make_room(self, DEVICE, num_tokens)

    def expire(self) -> list[EvictedPrefix]:
        """Drop unlocked prefixes idle past their lifetime, from every tier (a no-op while no node has a TTL)."""
        if not self._may_expire:
            return []
        now = self._clock()
        return self._remove_leaves(lambda node: is_expired(node, now), expired=True)

    def flush(self) -> int:
        """Drop every unlocked prefix in every namespace and tier; returns the number of tokens removed."""
        removed = self._remove_leaves(lambda node: True, expired=False, remember=False)
        self._ghosts.clear()
        if not any(self.protected) and not any(self.evictable):
            self.events.cleared()
        return sum(prefix.num_tokens for prefix in removed)

    def _remove_leaves(
        self, eligible: Callable[[RadixNode], bool], *, expired: bool, remember: bool = True
    ) -> list[EvictedPrefix]:
        """Drop unlocked eligible leaves (no child in any tier), then parents that become such leaves."""
        heap = [(self._priority(leaf), leaf.node_id, leaf) for leaf in self._unlocked_leaves() if eligible(leaf)]
        heapq.heapify(heap)
        removed: list[EvictedPrefix] = []
        while heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            removed.append(self.drop_leaf(leaf, expired=expired, remember=remember))
            if not parent.is_root and parent.is_leaf and parent.lock_ref == 0 and eligible(parent):
                heapq.heappush(heap, (self._priority(parent), parent.node_id, parent))
        return removed

    def drop_subtree(self, node: RadixNode, *, remember: bool = True) -> list[EvictedPrefix]:
        """Drop an unlocked `node` and everything below it from every tier (deepest first)."""
        order, stack = [], [node]
        while stack:
            current = stack.pop()
            order.append(current)
            stack.extend(current.children.values())
        return [self.drop_leaf(current, expired=False, remember=remember) for current in reversed(order)]

    def drop_leaf(self, leaf: RadixNode, *, expired: bool, remember: bool) -> EvictedPrefix:
        """Remove a node without children from the tree and give back its copies in every tier."""
        parent = leaf.parent
        path = leaf.path_token_ids()
        namespace = self.namespace_of(leaf)
        del parent.children[child_key(leaf.key, 0, self.page_size)]
        self.account(leaf, -1)
        for tier in range(3):
            if leaf.copy_in(tier) is not None:
                self.tiers.free_copy(leaf, tier)
                self.tiers.counters[tier].dropped_tokens_total += leaf.num_tokens
        if remember:
            first_removed_page = len(path) - leaf.num_tokens + self.page_size
            kind = MissKind.EXPIRED if expired else MissKind.EVICTED
            self._ghosts.remember(prefix_hash(namespace, path[:first_removed_page]), kind)
        if expired:
            self.expired_tokens_total += leaf.num_tokens
        else:
            self.evicted_tokens_total += leaf.num_tokens
        leaf.parent = None
        self.events.removed(namespace, path, leaf.num_tokens)
        return EvictedPrefix(namespace, tuple(path), leaf.num_tokens, expired)

    # ---- introspection ------------------------------------------------------------------------------------------

    def _unlocked_leaves(self) -> list[RadixNode]:
        leaves, stack = [], list(self._roots.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif not node.is_root and node.lock_ref == 0:
                leaves.append(node)
        return leaves

    def namespace_of(self, node: RadixNode) -> str:
        while node.parent is not None and not node.parent.is_root:
            node = node.parent
        root = node.parent
        for namespace, candidate in self._roots.items():
            if candidate is root:
                return namespace
        raise RuntimeError(f"node {node.node_id} is not in any namespace")

    @property
    def cached_tokens(self) -> int:
        """Tokens whose KV is in the device pool (L1)."""
        return self.evictable_tokens + self.protected_tokens

    def roots(self) -> dict[str, RadixNode]:
        return self._roots

    def root_for(self, namespace: str) -> RadixNode:
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = RadixNode(None, [], _NO_SLOTS, self._clock())
        return root

    def now_s(self) -> float:
        return self._clock()

    def eviction_key(self, node: RadixNode) -> tuple:
        """Lower goes first: non-persistent before persistent, then the policy's order."""
        return (node.persistent, *self._priority(node))

    def tier_stats(self) -> dict[str, dict]:
        """Per tier (device, host, disk): capacity, occupancy and counters, as the `/v1/cache` "tiers" object."""
        return tier_eviction.tier_stats(self)

    def stats(self) -> CacheStats:
        """Device (L1) occupancy and totals; `tier_stats` has every tier."""
        return cache_stats(self)

    def snapshot(self, max_nodes: int) -> dict:
        return tree_snapshot(self._roots, max_nodes, self._clock())

    def check_integrity(self, num_slots_outside_tree: int = 0) -> None:
        """Raise AssertionError unless the tree invariants hold and free + evictable + protected (+ slots held by
        in-flight requests outside the tree) == capacity."""
        check_tree_integrity(
            roots=self._roots,
            page_size=self.page_size,
            free_slots=self.allocator.free_slot_ids(),
            capacity=self.allocator.num_slots,
            evictable_tokens=self.evictable_tokens,
            protected_tokens=self.protected_tokens,
            num_slots_outside_tree=num_slots_outside_tree,
        )
        check_tier_integrity(self, num_slots_outside_tree)

