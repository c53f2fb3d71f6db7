"""The per-tier half of `RadixCache.check_integrity` (the device half is `tree_views.check_tree_integrity`).

Checks, raising AssertionError: every node holds at least one copy and each copy covers exactly its edge; a child's
fastest tier is never faster than its parent's; per tier the tree's evictable and protected counts equal what the
nodes hold; host: free + evictable + protected == capacity and no slot is owned twice; disk: every extent's file
exists and is known, references per file equal the extents naming it, and used == evictable + protected <= capacity.
"""

from __future__ import annotations

from collections import Counter

import torch

from local_engine.cache.tiers.store import DISK, HOST


def check_tier_integrity(cache, num_slots_outside_tree: int) -> None:
    tiers = cache.tiers
    evictable, protected = [0, 0, 0], [0, 0, 0]
    host_pieces = [tiers.host_allocator.free_slot_ids()] if tiers.host_allocator else []
    pending = tiers.pending_clean  # a host copy the idle cleaner has under way holds its host slots outside the tree
    if pending is not None:
        host_pieces.append(pending.host_slots)
    file_refs: Counter = Counter()
    for root in cache.roots().values():
        stack = [root]
        while stack:
            node = stack.pop()
            for child in node.children.values():
                stack.append(child)
                _check_node(cache, node, child)
                counts = protected if child.lock_ref else evictable
                for tier in range(3):
                    if child.copy_in(tier) is not None:
                        counts[tier] += child.num_tokens
                if child.host_slots is not None:
                    host_pieces.append(child.host_slots)
                if child.disk is not None:
                    file_refs[child.disk.file.name] += 1
    for tier in range(3):
        assert evictable[tier] == cache.evictable[tier], f"tier {tier}: evictable count {cache.evictable[tier]} but " \
            f"the tree holds {evictable[tier]}"
        assert protected[tier] == cache.protected[tier], f"tier {tier}: protected count {cache.protected[tier]} but " \
            f"the tree holds {protected[tier]}"
    if tiers.host_allocator is not None:
        slots = torch.cat(host_pieces)
        assert slots.unique().numel() == slots.numel(), "a host slot is owned twice"
        total = tiers.host_allocator.num_free + evictable[HOST] + protected[HOST]
        total += 0 if pending is None else pending.host_slots.numel()
        assert total == tiers.host_allocator.num_slots, f"host: free + evictable + protected (+ a copy under way) = " \
            f"{total} != capacity " \
            f"{tiers.host_allocator.num_slots}"
    else:
        assert evictable[HOST] == protected[HOST] == 0, "host copies without a host tier"
    if tiers.disk is not None:
        disk = tiers.disk
        used = evictable[DISK] + protected[DISK]
        assert disk.used_tokens == used, f"disk: {disk.used_tokens} tokens counted used, extents hold {used}"
        assert used <= disk.capacity_tokens, f"disk: {used} tokens held past the capacity {disk.capacity_tokens}"
        assert disk.free_tokens + used == disk.capacity_tokens, "disk: free + evictable + protected != capacity"
        for name, refs in file_refs.items():
            file = disk.files.get(name)
            assert file is not None, f"disk: extent of an unknown file {name}"
            assert file.refs == refs, f"disk: {name} has {file.refs} references, {refs} extents name it"
            assert disk.file_exists(file), f"disk: {name} is referenced but missing"
        assert set(disk.files) == set(file_refs), "disk: a known file no extent references"
    else:
        assert evictable[DISK] == protected[DISK] == 0, "disk copies without a disk tier"
    assert num_slots_outside_tree >= 0


def _check_node(cache, parent, node) -> None:
    tier = node.tier_index
    assert tier <= DISK, f"node {node.node_id}: holds no copy of its KV"
    if not parent.is_root:
        assert parent.tier_index <= tier, f"node {node.node_id}: in tier {tier} under a parent in tier " \
            f"{parent.tier_index}"
    if node.slots is not None:
        assert node.slots.numel() == node.num_tokens, f"node {node.node_id}: device slots and tokens differ"
    if node.host_slots is not None:
        assert node.host_slots.numel() == node.num_tokens, f"node {node.node_id}: host slots and tokens differ"
    if node.disk is not None:
        extent = node.disk
        assert extent.num_tokens == node.num_tokens, f"node {node.node_id}: disk extent and tokens differ"
        assert 0 <= extent.start and extent.start + extent.num_tokens <= extent.file.num_tokens, \
            f"node {node.node_id}: disk extent outside its file"
