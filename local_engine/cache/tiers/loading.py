"""Load-back: put the host and disk part of a locked match into device slots before the request is prefilled.

The matched path is device nodes, then host nodes, then disk nodes (fastest-tier order). Each lower node's KV is
read from its fastest copy and written into the caller's device slots, which become the node's device copy (the
lower copies stay: the bytes are immutable, so a later L1 eviction of the node costs nothing).

A disk file that fails its checks is never served: the match is cut before that node, the lock moves up to the last
loaded node, and every node that relied on that file (and, for a node with no other copy, its subtree, now
unreachable) is dropped. The warning is logged and counted; the request prefills the rest.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch

from local_engine.cache.tiers.disk_store import CorruptKVFile
from local_engine.cache.radix_node import RadixNode
from local_engine.cache.tiers.store import DEVICE, DISK, HOST
from local_engine.cache.tiers import TierTokens
from local_engine.cache.types import MatchResult, MissKind

log = logging.getLogger(__name__)


def load_back(movement, namespace: str, token_ids: list[int], match: MatchResult, slots: torch.Tensor) -> MatchResult:
    """Load the lower-tier part of `match` (locked by the caller) into device `slots` (int64
    `[match.matched_tokens - match.tier_tokens.device]`, allocated by the caller).

    Returns the match as served: `slots` now cover `matched_tokens` (the device part, then `slots[:n]`), `node` is
    what the caller holds locked (moved up when a corrupt file cut the match), `tier_tokens` counts what was served
    from each tier, `load_ms` the time spent loading. The unused tail of `slots` stays the caller's."""
    tiers = movement.store
    path = _path(match.node)
    lower = [node for node in path if node.slots is None]
    offset, served = 0, [match.tier_tokens.device, 0, 0]
    spent_ms = [0.0, 0.0, 0.0]
    locked, cut = match.node, False
    for node in lower:
        tier = node.tier_index
        started = time.perf_counter()
        piece = slots[offset : offset + node.num_tokens]
        try:
            if tier == HOST:
                tiers.load_host_into_device(node, piece)  # pool to pool, no temporary tensor
            else:
                k, v = tiers.read(node, tier)
                tiers.load_into_device(k, v, piece)
        except CorruptKVFile as error:
            log.warning("disk KV cache: not serving a corrupt file (%s); the prompt is recomputed from there", error)
            parent = node.parent
            locked = None if parent.is_root else parent
            movement.tree.lock(locked)
            movement.tree.unlock(match.node)
            drop_file_users(movement, node)
            cut = True
            break
        if tiers.device_pool.k.device.type == "cuda":
            torch.cuda.synchronize(tiers.device_pool.k.device)  # the load's time is the copy's, not its launch's
        spent_ms[tier] += (time.perf_counter() - started) * 1000
        movement.tree.account(node, -1)
        node.slots = piece.clone()
        movement.tree.account(node, 1)
        served[tier] += node.num_tokens
        offset += node.num_tokens
    for tier in (1, 2):
        if served[tier]:
            counter = tiers.counters[tier]
            counter.loads_total += 1
            counter.load_tokens_total += served[tier]
            counter.load_ms_total += spent_ms[tier]
    matched = served[DEVICE] + offset
    miss_kind = match.miss_kind
    if cut:
        limit = movement.tree.max_matchable_tokens(len(token_ids))
        miss_kind = movement.tree.miss_kind(namespace, token_ids, matched, limit)
        dropped = movement.tree.dropped(namespace, token_ids, matched)
        known = miss_kind in (MissKind.EVICTED, MissKind.EXPIRED) and dropped is not None
        match = dataclasses.replace(match, dropped=dropped.as_dict(movement.tree.now_s()) if known else None)
    return dataclasses.replace(
        match,
        slots=torch.cat([match.slots, slots[:offset]]),
        matched_tokens=matched,
        miss_kind=miss_kind,
        node=locked,
        tier_tokens=TierTokens(*served),
        load_ms=sum(spent_ms),
    )


def drop_file_users(movement, failed: RadixNode) -> None:
    """`failed`'s disk file is corrupt: take it out of every node that references it (dropping a node, with its
    subtree, when that was its only copy) and delete it."""
    file = failed.disk.file
    namespace = movement.tree.namespace_of(failed)
    users, stack = [], [movement.tree.roots()[namespace]]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if node.disk is not None and node.disk.file is file:
            users.append(node)
    for node in users:
        if node.parent is None:  # already dropped with an ancestor
            continue
        if node.slots is not None or node.host_slots is not None:
            movement.tree.account(node, -1)
            movement.store.free_copy(node, DISK)
            movement.tree.account(node, 1)
            movement.store.counters[DISK].dropped_tokens_total += node.num_tokens
        else:
            movement.tree.drop_subtree(node)
    movement.store.disk.delete(file)


def _path(node: RadixNode | None) -> list[RadixNode]:
    nodes = []
    while node is not None and not node.is_root:
        nodes.append(node)
        node = node.parent
    return nodes[::-1]
