"""Making room in a tier: which copies go, where they go (demotion), and the per-tier stats.

Candidates in tier T are unlocked nodes holding a copy in T none of whose children is held in T or a faster tier
(so the fastest-tier order parent <= child survives the move), and unlocked nodes whose copy in T is a spare behind
a faster copy (giving it back changes no node's tier). They go in eviction order: non-persistent first,
then the policy's order (LRU by default). Taking a node's copy out of T:

- if it has another copy no slower than its children (write-through, or a copy kept after a load-back), T's copy
  is simply given back;
- else it is demoted: copied to the nearest slower enabled tier (no slower than its children) with room;
- else (last tier, or no room anywhere below) the node and its subtree leave the tree; the ghost index remembers
  them as `evicted`.

Making room in a slower tier may in turn demote or drop there; it never touches the node being moved or its
ancestors, which are held in a faster tier.
"""

from __future__ import annotations

import heapq

from local_engine.cache.radix_node import RadixNode
from local_engine.cache.tiers.store import DEVICE, DISK, HOST, TIER_NAMES
from local_engine.cache.types import EvictedPrefix


def is_candidate(node: RadixNode, tier: int) -> bool:
    return (
        node.parent is not None
        and node.lock_ref == 0
        and node.copy_in(tier) is not None
        # A copy behind a faster one can always go; otherwise no child may be held in this tier or a faster one.
        and (node.tier_index < tier or all(child.tier_index > tier for child in node.children.values()))
    )


def candidates(cache, tier: int) -> list[RadixNode]:
    found, stack = [], list(cache.roots().values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if not node.is_root and is_candidate(node, tier):
            found.append(node)
    return found


def make_room(cache, tier: int, num_tokens: int) -> list[EvictedPrefix]:
    """Take copies out of `tier` until `num_tokens` of its space came free (fewer only when nothing else can go).
    Returns the prefixes that left the tree on the way."""
    if num_tokens <= 0:
        return []
    heap = [(cache.eviction_key(node), node.node_id, node) for node in candidates(cache, tier)]
    heapq.heapify(heap)
    removed: list[EvictedPrefix] = []
    freed = 0
    while heap and freed < num_tokens:
        _, _, node = heapq.heappop(heap)
        if not is_candidate(node, tier):  # changed since the heap was built (a nested move dropped it)
            continue
        parent = node.parent
        freed += node.num_tokens
        removed.extend(release_copy(cache, node, tier))
        if not parent.is_root and is_candidate(parent, tier):
            heapq.heappush(heap, (cache.eviction_key(parent), parent.node_id, parent))
    return removed


def release_copy(cache, node: RadixNode, tier: int) -> list[EvictedPrefix]:
    """Take `node`'s copy out of `tier` (see the module docstring); returns what left the tree.

    The node's new fastest tier must stay no slower than its children's (`limit`): a remaining copy counts only if it
    is within that limit, and a demotion only goes as far as it."""
    tiers = cache.tiers
    if tier == DEVICE and tiers.pending_clean is not None:
        from local_engine.cache.tiers.cleaner import finish_pending  # the cleaner builds on this module

        finish_pending(cache, node)  # the idle cleaner had started its host copy: copy only the rest
    limit = min((child.tier_index for child in node.children.values()), default=DISK)
    remaining = [t for t in range(3) if t != tier and node.copy_in(t) is not None]
    if remaining and min(remaining) <= limit:
        cache.account(node, -1)
        tiers.free_copy(node, tier)
        cache.account(node, 1)
        counter = tiers.counters[tier]
        if max(remaining) > tier:
            counter.demoted_tokens_total += node.num_tokens
        else:
            counter.dropped_tokens_total += node.num_tokens
        return []
    removed: list[EvictedPrefix] = []
    for target in tiers.lower_tiers(tier):
        if target > limit:
            break
        if demote(cache, node, tier, target, removed):
            return removed
    return removed + cache.drop_subtree(node)


def demote(cache, node: RadixNode, source: int, target: int, removed: list[EvictedPrefix]) -> bool:
    """Move `node`'s only copy from `source` to the slower `target`, making room there first; False when `target`
    cannot take it."""
    tiers = cache.tiers
    if not reserve(cache, target, node.num_tokens, removed):
        return False
    cache.account(node, -1)
    moved = tiers.copy_to(node, source, target, cache.namespace_of(node))
    if moved:
        tiers.free_copy(node, source)
        tiers.counters[source].demoted_tokens_total += node.num_tokens
    cache.account(node, 1)
    return moved


def reserve(cache, tier: int, num_tokens: int, removed: list[EvictedPrefix]) -> bool:
    """Make `num_tokens` of `tier`'s space free if possible."""
    short = num_tokens - cache.tiers.free_tokens(tier)
    if short > 0 and tier == HOST and cache.tiers.pending_clean is not None:
        from local_engine.cache.tiers.cleaner import abandon_pending

        abandon_pending(cache)  # a demotion needs the room more than a copy ahead of time
        short = num_tokens - cache.tiers.free_tokens(tier)
    if short > 0:
        removed.extend(make_room(cache, tier, short))
    return cache.tiers.free_tokens(tier) >= num_tokens


def copy_down(cache, node: RadixNode, namespace: str) -> list[EvictedPrefix]:
    """write_through: give a newly stored device node copies in every enabled lower tier that can make room."""
    tiers = cache.tiers
    removed: list[EvictedPrefix] = []
    kv = None
    for target in (HOST, DISK):
        if not tiers.enabled(target) or node.copy_in(target) is not None:
            continue
        # Lock the node while room is made: it must not be the copy that goes.
        cache.lock(node)
        try:
            if not reserve(cache, target, node.num_tokens, removed):
                continue
        finally:
            cache.unlock(node)
        cache.account(node, -1)
        if target == HOST:
            tiers.copy_to(node, DEVICE, HOST, namespace)  # pool to pool
        else:
            if kv is None:
                kv = tiers.read(node, DEVICE)
            tiers.put(node, target, kv[0], kv[1], namespace)
        cache.account(node, 1)
    return removed


def tier_stats(cache) -> dict[str, dict]:
    tiers = cache.tiers
    stats = {}
    for tier, name in enumerate(TIER_NAMES):
        evictable, protected = cache.evictable[tier], cache.protected[tier]
        stats[name] = {
            "enabled": tiers.enabled(tier),
            "capacity_tokens": tiers.capacity_tokens(tier),
            "cached_tokens": evictable + protected,
            "free_tokens": tiers.free_tokens(tier),
            "evictable_tokens": evictable,
            "protected_tokens": protected,
            "capacity_bytes": tiers.capacity_bytes(tier),
            **tiers.counters[tier].as_dict(),
            "corrupt_files_total": tiers.disk.corrupt_files_total if tier == DISK and tiers.disk else 0,
        }
    return stats
