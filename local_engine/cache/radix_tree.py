"""RadixTree: the radix tree's structure and bookkeeping, shared by RadixCache and the tier movement.

RadixCache (the `PrefixCache` the engine calls) matches and inserts through it; `TierMovement` moves copies between
tiers through it. Neither reaches past it: node structure (split, drop, namespaces), the per-tier evictable and
protected counts, lifetimes and expiry, the ghost index of removed prefixes and the event log all live here.
Callers serialize access (the engine holds one lock around the cache).
"""

from __future__ import annotations

import heapq
from typing import Callable

import torch

from local_engine.cache.block_events import BlockEvents
from local_engine.cache.ghost_index import DroppedPrefix, GhostIndex, prefix_hash
from local_engine.cache.radix_node import RadixNode, child_key
from local_engine.cache.retention import Lifetime, lifetime_of
from local_engine.cache.seen_index import SeenIndex
from local_engine.cache.tiers.store import TIER_NAMES, TierStore
from local_engine.cache.types import EvictedPrefix, MissKind

NO_SLOTS = torch.empty(0, dtype=torch.int64)


class RadixTree:
    """Per-namespace radix trees of RadixNodes over one TierStore (the copies' bytes and slots).

    `page_size`: tokens per page (edges are whole pages). `priority`: the eviction policy's sort key (lower goes
    first). `default_ttl_s`: the lifetime of a node stored without a retention class (None: no TTL). `clock`: seconds,
    monotonic. `events`: told of every change to what the tiers hold."""

    def __init__(
        self,
        page_size: int,
        priority: Callable[[RadixNode], tuple],
        store: TierStore,
        clock: Callable[[], float],
        events: BlockEvents,
        *,
        default_ttl_s: float | None = None,
        ghost_capacity: int = 65_536,
    ) -> None:
        self.page_size = page_size
        self.store = store
        self.now_s = clock
        self._priority = priority
        self._default_ttl_s = default_ttl_s
        self._roots: dict[str, RadixNode] = {}
        self._ghosts = GhostIndex(ghost_capacity)
        self.seen = SeenIndex(ghost_capacity, page_size)  # what each namespace computed, cached or not
        self.evictable = [0, 0, 0]  # per tier (device, host, disk): tokens held by unlocked nodes
        self.protected = [0, 0, 0]  # per tier: tokens held by locked nodes
        self.evicted_tokens_total = 0
        self.expired_tokens_total = 0
        self.may_expire = default_ttl_s is not None  # set once any node gets a TTL from a retention class
        self.events = events  # what each tier holds, as KV-event blocks, for cache-aware routers

    # ---- namespaces and nodes -----------------------------------------------------------------------------------

    def roots(self) -> dict[str, RadixNode]:
        return self._roots

    def root_for(self, namespace: str) -> RadixNode:
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = RadixNode(None, [], NO_SLOTS, self.now_s())
        return root

    def namespace_of(self, node: RadixNode) -> str:
        while node.parent is not None and not node.parent.is_root:
            node = node.parent
        root = node.parent
        for namespace, candidate in self._roots.items():
            if candidate is root:
                return namespace
        raise RuntimeError(f"node {node.node_id} is not in any namespace")

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
        self.store.split_copies(upper, child, num_tokens)
        child.key = child.key[num_tokens:]
        child.slots = None if device is None else device[num_tokens:]
        child.parent = upper
        upper.children[child_key(child.key, 0, self.page_size)] = child
        return upper

    # ---- counts, locks, lifetimes ---------------------------------------------------------------------------------

    def account(self, node: RadixNode, sign: int) -> None:
        """Add (`sign=1`) or take away (`-1`) `node`'s copies from the per-tier counts; call with -1 before changing
        a node's copies or lock state and with +1 after."""
        counts = self.protected if node.lock_ref else self.evictable
        for tier in range(3):
            if node.copy_in(tier) is not None:
                counts[tier] += sign * node.num_tokens
        if sign > 0:
            self.events.accounted(self, node)

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

    def lifetime(self, retention: str | None) -> Lifetime:
        """Raises ValueError for an unknown retention class."""
        lifetime = lifetime_of(retention, self._default_ttl_s)
        self.may_expire = self.may_expire or lifetime.ttl_s is not None
        return lifetime

    def enable_expiry(self) -> None:
        """A node with a TTL exists (rebuilt from disk, say): expiry has work to do."""
        self.may_expire = True

    def eviction_key(self, node: RadixNode) -> tuple:
        """Lower goes first: non-persistent before persistent, then the policy's order."""
        return (node.persistent, *self._priority(node))

    # ---- misses -------------------------------------------------------------------------------------------------

    def max_matchable_tokens(self, num_prompt_tokens: int) -> int:
        """The last prompt token is always computed (its logits start the answer); matches are page-aligned."""
        limit = max(0, num_prompt_tokens - 1)
        return limit - limit % self.page_size

    def miss_kind(self, namespace: str, token_ids: list[int], matched: int, limit: int) -> MissKind:
        if limit == 0:  # a prompt too short to match anything reuses nothing, whatever was cached
            return MissKind.COLD
        if matched >= limit:
            return MissKind.HIT
        removed = self.dropped(namespace, token_ids, matched)
        if removed is not None:
            return removed.kind
        return MissKind.PARTIAL if matched else MissKind.COLD

    def dropped(self, namespace: str, token_ids: list[int], matched: int) -> DroppedPrefix | None:
        """What the ghost index remembers of the page after a match of `matched` tokens (None: nothing)."""
        if matched + self.page_size > len(token_ids):
            return None
        return self._ghosts.lookup(prefix_hash(namespace, token_ids[: matched + self.page_size]))

    def forget_removed(self) -> None:
        """Clear the ghost index and what was computed (after a flush: nothing before it explains a later miss)."""
        self._ghosts.clear()
        self.seen.clear()

    # ---- removal ------------------------------------------------------------------------------------------------

    def remove_leaves(
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
        held = TIER_NAMES[min(leaf.tier_index, 2)]  # before its copies are given back
        del parent.children[child_key(leaf.key, 0, self.page_size)]
        self.account(leaf, -1)
        for tier in range(3):
            if leaf.copy_in(tier) is not None:
                self.store.free_copy(leaf, tier)
                self.store.counters[tier].dropped_tokens_total += leaf.num_tokens
        if remember:
            first_removed_page = len(path) - leaf.num_tokens + self.page_size
            kind = MissKind.EXPIRED if expired else MissKind.EVICTED
            lifetime = Lifetime(leaf.ttl_s, leaf.persistent)
            dropped = DroppedPrefix(kind, held, lifetime.label, leaf.last_access_s)
            self._ghosts.remember(prefix_hash(namespace, path[:first_removed_page]), dropped)
        if expired:
            self.expired_tokens_total += leaf.num_tokens
        else:
            self.evicted_tokens_total += leaf.num_tokens
        leaf.parent = None
        self.events.removed(namespace, path, leaf.num_tokens)
        return EvictedPrefix(namespace, tuple(path), leaf.num_tokens, expired)

    def _unlocked_leaves(self) -> list[RadixNode]:
        leaves, stack = [], list(self._roots.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif not node.is_root and node.lock_ref == 0:
                leaves.append(node)
        return leaves
