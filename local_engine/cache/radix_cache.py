"""RadixCache: the prefix index. A compressed radix tree over token ids per namespace; node values are slot ids.

The tree never touches K/V bytes: it maps token prefixes to KV pool slots, decides what to evict, and frees the
slots of what it evicts back to the SlotAllocator. Callers serialize access (the engine holds one lock around it).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from typing import Callable

import torch

from local_engine.cache.events import CacheEventLog
from local_engine.cache.eviction import eviction_policy
from local_engine.cache.ghost_index import GhostIndex, prefix_hash
from local_engine.cache.radix_node import RadixNode, child_key, common_prefix_tokens
from local_engine.cache.slot_allocator import SlotAllocator
from local_engine.cache.tree_views import CacheStats, check_tree_integrity, tree_snapshot
from local_engine.cache.types import EvictedPrefix, InsertResult, MatchResult, MissKind

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
        self, config: RadixCacheConfig, allocator: SlotAllocator, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.page_size = config.page_size
        self.allocator = allocator
        self._clock = clock
        self._priority = eviction_policy(config.eviction)
        self._roots: dict[str, RadixNode] = {}
        self._ghosts = GhostIndex(config.ghost_capacity)
        self.evictable_tokens = 0
        self.protected_tokens = 0
        self.evicted_tokens_total = 0
        self.expired_tokens_total = 0
        self.events = CacheEventLog()  # what was stored and removed, as block hashes, for cache-aware routers

    # ---- lookup -------------------------------------------------------------------------------------------------

    def max_matchable_tokens(self, num_prompt_tokens: int) -> int:
        """The last prompt token is always computed (its logits start the answer); matches are page-aligned."""
        limit = max(0, num_prompt_tokens - 1)
        return limit - limit % self.page_size

    def match(self, namespace: str, token_ids: list[int], *, dry_run: bool = False) -> MatchResult:
        """The longest cached page-aligned prefix of `token_ids` (at most all but the last token) in `namespace`.

        A match that ends inside an edge splits that node so the matched part can be locked on its own. With
        `dry_run` nothing changes: no split, no access time, no hit count, no expiry.
        """
        if not dry_run:
            self.expire()
        limit = self.max_matchable_tokens(len(token_ids))
        root = self._roots.get(namespace)
        node, matched, pieces = root, 0, []
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
                    pieces.append(child.slots[:same])
                    matched += same
                    break
                child = self._split(child, same)
            if not dry_run:
                child.last_access_s = now
                child.hit_count += 1
            pieces.append(child.slots)
            matched += same
            node = child
        slots = torch.cat(pieces) if pieces else _NO_SLOTS
        miss_kind = self._miss_kind(namespace, token_ids, matched, limit)
        locked_node = node if (node is not None and not node.is_root and not dry_run) else None
        return MatchResult(slots, matched, len(token_ids), miss_kind, locked_node)

    def _miss_kind(self, namespace: str, token_ids: list[int], matched: int, limit: int) -> MissKind:
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
                self.evictable_tokens -= node.num_tokens
                self.protected_tokens += node.num_tokens
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode | None) -> None:
        while node is not None and not node.is_root:
            if node.lock_ref <= 0:
                raise RuntimeError(f"unlock of node {node.node_id} that is not locked")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.protected_tokens -= node.num_tokens
                self.evictable_tokens += node.num_tokens
            node = node.parent

    # ---- insertion ----------------------------------------------------------------------------------------------

    def insert(self, namespace: str, token_ids: list[int], slots: torch.Tensor) -> InsertResult:
        """Index `token_ids` (page-aligned part) with their KV in `slots` (int64 `[len(token_ids)]`).

        The tree takes ownership of the slots it stores. The caller frees its slots in
        `[num_already_cached_before_its_own_match, result.num_cached_tokens)` (another request stored those first)
        and `[result.num_stored_tokens, len(token_ids))` (the unaligned tail).
        """
        if slots.numel() != len(token_ids):
            raise ValueError(f"{len(token_ids)} tokens but {slots.numel()} slots")
        stored = len(token_ids) - len(token_ids) % self.page_size
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = RadixNode(None, [], _NO_SLOTS, self._clock())
        now = self._clock()
        node, position = root, 0
        while position < stored:
            child = node.children.get(child_key(token_ids, position, self.page_size))
            if child is None:
                leaf = RadixNode(node, token_ids[position:stored], slots[position:stored].clone(), now)
                node.children[child_key(token_ids, position, self.page_size)] = leaf
                self.evictable_tokens += leaf.num_tokens
                self.events.stored(namespace, token_ids[:stored], position)
                return InsertResult(num_cached_tokens=position, num_stored_tokens=stored, node=leaf)
            same = common_prefix_tokens(child.key, token_ids, position, stored, self.page_size)
            if same < child.num_tokens:
                child = self._split(child, same)
            child.last_access_s = now
            position += same
            node = child
        return InsertResult(num_cached_tokens=stored, num_stored_tokens=stored, node=node if position else None)

    def _split(self, child: RadixNode, num_tokens: int) -> RadixNode:
        """Cut `child`'s edge after `num_tokens`; returns the new upper node, which keeps the child's locks."""
        parent = child.parent
        upper = RadixNode(parent, child.key[:num_tokens], child.slots[:num_tokens], child.last_access_s)
        upper.lock_ref = child.lock_ref
        upper.hit_count = child.hit_count
        upper.created_s = child.created_s
        parent.children[child_key(child.key, 0, self.page_size)] = upper
        child.key = child.key[num_tokens:]
        child.slots = child.slots[num_tokens:]
        child.parent = upper
        upper.children[child_key(child.key, 0, self.page_size)] = child
        return upper

    # ---- removal ------------------------------------------------------------------------------------------------

    def evict(self, num_tokens: int) -> list[EvictedPrefix]:
        """Free at least `num_tokens` slots from unlocked leaves, by policy; fewer only if nothing else is evictable."""
        return self._remove_leaves(lambda node: True, num_tokens, expired=False)

    def expire(self) -> list[EvictedPrefix]:
        """Drop unlocked prefixes not touched within the TTL (a no-op without one)."""
        if self.config.ttl_s is None:
            return []
        deadline = self._clock() - self.config.ttl_s
        return self._remove_leaves(lambda node: node.last_access_s <= deadline, None, expired=True)

    def flush(self) -> int:
        """Drop every unlocked prefix in every namespace; returns the number of tokens freed."""
        removed = self._remove_leaves(lambda node: True, None, expired=False, remember=False)
        self._ghosts.clear()
        if self.cached_tokens == 0:
            self.events.cleared()
        return sum(prefix.num_tokens for prefix in removed)

    def _remove_leaves(
        self, eligible: Callable[[RadixNode], bool], num_tokens: int | None, *, expired: bool, remember: bool = True
    ) -> list[EvictedPrefix]:
        heap = [(self._priority(leaf), leaf.node_id, leaf) for leaf in self._unlocked_leaves() if eligible(leaf)]
        heapq.heapify(heap)
        removed: list[EvictedPrefix] = []
        freed = 0
        while heap and (num_tokens is None or freed < num_tokens):
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            removed.append(self._remove_leaf(leaf, expired=expired, remember=remember))
            freed += leaf.num_tokens
            if not parent.is_root and parent.is_leaf and parent.lock_ref == 0 and eligible(parent):
                heapq.heappush(heap, (self._priority(parent), parent.node_id, parent))
        return removed

    def _remove_leaf(self, leaf: RadixNode, *, expired: bool, remember: bool) -> EvictedPrefix:
        parent = leaf.parent
        del parent.children[child_key(leaf.key, 0, self.page_size)]
        self.allocator.free(leaf.slots)
        self.evictable_tokens -= leaf.num_tokens
        path = leaf.path_token_ids()
        namespace = self._namespace_of(leaf)
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

    def _namespace_of(self, node: RadixNode) -> str:
        while node.parent is not None and not node.parent.is_root:
            node = node.parent
        root = node.parent
        for namespace, candidate in self._roots.items():
            if candidate is root:
                return namespace
        raise RuntimeError(f"node {node.node_id} is not in any namespace")

    @property
    def cached_tokens(self) -> int:
        return self.evictable_tokens + self.protected_tokens

    def stats(self) -> CacheStats:
        num_nodes = sum(_count_nodes(root) for root in self._roots.values())
        return CacheStats(
            capacity_tokens=self.allocator.num_slots,
            free_tokens=self.allocator.num_free,
            cached_tokens=self.cached_tokens,
            evictable_tokens=self.evictable_tokens,
            protected_tokens=self.protected_tokens,
            num_nodes=num_nodes,
            num_namespaces=sum(1 for root in self._roots.values() if root.children),
            evicted_tokens_total=self.evicted_tokens_total,
            expired_tokens_total=self.expired_tokens_total,
            page_size=self.page_size,
            eviction=self.config.eviction,
            ttl_s=self.config.ttl_s,
        )

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


def _count_nodes(root: RadixNode) -> int:
    count, stack = 0, list(root.children.values())
    while stack:
        node = stack.pop()
        count += 1
        stack.extend(node.children.values())
    return count
