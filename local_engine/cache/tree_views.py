"""Read-only views of a radix tree: stats, a bounded snapshot for the API, and the integrity check."""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import asdict, dataclass

import torch

from local_engine.cache.radix_node import RadixNode, child_key


@dataclass(frozen=True)
class CacheStats:
    capacity_tokens: int
    free_tokens: int
    cached_tokens: int
    evictable_tokens: int
    protected_tokens: int
    num_nodes: int
    num_namespaces: int
    evicted_tokens_total: int
    expired_tokens_total: int
    page_size: int
    eviction: str
    ttl_s: float | None

    def as_dict(self) -> dict:
        return asdict(self)


def cache_stats(cache, roots: dict[str, RadixNode]) -> CacheStats:
    """A RadixCache's device (L1) occupancy and removal totals; `roots` are its trees by namespace."""
    return CacheStats(
        capacity_tokens=cache.allocator.num_slots,
        free_tokens=cache.allocator.num_free,
        cached_tokens=cache.cached_tokens,
        evictable_tokens=cache.evictable_tokens,
        protected_tokens=cache.protected_tokens,
        num_nodes=sum(_count_nodes(root) for root in roots.values()),
        num_namespaces=sum(1 for root in roots.values() if root.children),
        evicted_tokens_total=cache.evicted_tokens_total,
        expired_tokens_total=cache.expired_tokens_total,
        page_size=cache.page_size,
        eviction=cache.config.eviction,
        ttl_s=cache.config.ttl_s,
    )


def _count_nodes(root: RadixNode) -> int:
    count, stack = 0, list(root.children.values())
    while stack:
        node = stack.pop()
        count += 1
        stack.extend(node.children.values())
    return count


def namespace_label(namespace: str) -> str:
    """Namespaces are tenant salts: show a short hash, never the salt itself."""
    if not namespace:
        return "default"
    return hashlib.sha256(namespace.encode()).hexdigest()[:12]


def tree_snapshot(roots: dict[str, RadixNode], max_nodes: int, now_s: float) -> dict:
    """At most `max_nodes` nodes in all, breadth-first per namespace so the top of every tree is shown."""
    namespaces, budget, truncated = [], max_nodes, False
    for namespace, root in roots.items():
        if not root.children:
            continue
        root_view = _node_view(root, now_s)
        queue = deque([(root, root_view)])
        while queue:
            node, view = queue.popleft()
            for child in node.children.values():
                if budget <= 0:
                    truncated = True
                    break
                budget -= 1
                child_view = _node_view(child, now_s)
                view["children"].append(child_view)
                queue.append((child, child_view))
        namespaces.append({"namespace": namespace_label(namespace), "root": root_view})
    return {"namespaces": namespaces, "truncated": truncated}


def _node_view(node: RadixNode, now_s: float) -> dict:
    return {
        "id": node.node_id,
        "num_tokens": node.num_tokens,
        "hit_count": node.hit_count,
        "last_access_s": round(max(0.0, now_s - node.last_access_s), 3),
        "locked": node.lock_ref > 0,
        "tier": ("device", "host", "disk", "none")[node.tier_index],
        "children": [],
    }


def check_tree_integrity(
    *,
    roots: dict[str, RadixNode],
    page_size: int,
    free_slots: torch.Tensor,
    capacity: int,
    evictable_tokens: int,
    protected_tokens: int,
    num_slots_outside_tree: int,
) -> None:
    evictable = protected = 0
    slot_pieces = [free_slots]
    for namespace, root in roots.items():
        assert root.is_root and not root.key, f"namespace {namespace!r}: root must be empty"
        stack = [root]
        while stack:
            node = stack.pop()
            for key, child in node.children.items():
                assert child.parent is node, f"node {child.node_id}: wrong parent"
                assert child.num_tokens > 0, f"node {child.node_id}: empty edge"
                assert child.num_tokens % page_size == 0, f"node {child.node_id}: edge not page-aligned"
                if child.slots is not None:
                    assert child.slots.numel() == child.num_tokens, f"node {child.node_id}: slots and tokens differ"
                assert key == child_key(child.key, 0, page_size), f"node {child.node_id}: filed under a wrong key"
                assert child.lock_ref >= 0, f"node {child.node_id}: negative lock count"
                if not node.is_root:
                    assert node.lock_ref >= child.lock_ref, f"node {child.node_id}: locked more than its parent"
                if child.slots is not None:  # the device pool's part; lower tiers are checked in tiers/integrity
                    if child.lock_ref:
                        protected += child.num_tokens
                    else:
                        evictable += child.num_tokens
                    slot_pieces.append(child.slots)
                stack.append(child)
    assert evictable == evictable_tokens, f"evictable count {evictable_tokens} but tree holds {evictable}"
    assert protected == protected_tokens, f"protected count {protected_tokens} but tree holds {protected}"
    all_slots = torch.cat(slot_pieces)
    assert all_slots.unique().numel() == all_slots.numel(), "a slot is owned twice (tree and free list, or two nodes)"
    total = free_slots.numel() + evictable + protected + num_slots_outside_tree
    assert total == capacity, (
        f"free {free_slots.numel()} + evictable {evictable} + protected {protected} + in flight "
        f"{num_slots_outside_tree} != capacity {capacity}"
    )
