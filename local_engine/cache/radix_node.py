"""One node of the radix tree: a compressed edge of token ids and where their KV lives (device, host, disk)."""

from __future__ import annotations

import itertools
from typing import Hashable

import torch

_node_ids = itertools.count(1)


class RadixNode:
    """`key` (token ids) and each copy of its KV always have equal length; the root's are empty.

    Copies: `slots` (device pool slot ids, int64 `[len(key)]`, or None once the KV left L1), `host_slots` (host pool
    slot ids, or None) and `disk` (a `DiskExtent`, or None). A node holds at least one copy; its tier is the fastest
    one (`tier_index`: 0 device, 1 host, 2 disk), and a child's tier is never faster than its parent's.

    `lock_ref` counts the requests using this node (and therefore every ancestor); a node with `lock_ref > 0` is
    protected from eviction. `ttl_s` (idle seconds before expiry; None never expires) and `persistent` come from the
    longest retention class that stored or used the node.
    """

    __slots__ = (
        "node_id", "parent", "key", "slots", "children", "lock_ref", "last_access_s", "created_s", "hit_count",
        "host_slots", "disk", "ttl_s", "persistent", "kv_tiers",
    )

    def __init__(self, parent: RadixNode | None, key: list[int], slots: torch.Tensor, now_s: float) -> None:
        self.node_id = next(_node_ids)
        self.parent = parent
        self.key = key
        self.slots = slots
        self.children: dict[Hashable, RadixNode] = {}
        self.lock_ref = 0
        self.last_access_s = now_s
        self.created_s = now_s
        self.hit_count = 0
        self.host_slots: torch.Tensor | None = None
        self.disk = None  # DiskExtent | None
        self.ttl_s: float | None = None
        self.persistent = False
        self.kv_tiers = -1  # the tiers last announced for this node (`local_engine.kv_events.block_events`)

    @property
    def num_tokens(self) -> int:
        return len(self.key)

    @property
    def tier_index(self) -> int:
        """The fastest tier holding this node's KV: 0 device, 1 host, 2 disk (3: none, only while being dropped)."""
        if self.slots is not None:
            return 0
        if self.host_slots is not None:
            return 1
        return 2 if self.disk is not None else 3

    def copy_in(self, tier: int):
        """This node's copy in tier `tier` (0 device slots, 1 host slots, 2 disk extent), or None."""
        return (self.slots, self.host_slots, self.disk)[tier]

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def path_token_ids(self) -> list[int]:
        """Every token id from the root down to the end of this node."""
        pieces = []
        node: RadixNode | None = self
        while node is not None and not node.is_root:
            pieces.append(node.key)
            node = node.parent
        return [token for piece in reversed(pieces) for token in piece]

    def depth_tokens(self) -> int:
        depth, node = 0, self
        while node is not None and not node.is_root:
            depth += node.num_tokens
            node = node.parent
        return depth


def child_key(token_ids: list[int], start: int, page_size: int) -> Hashable:
    """How a parent files the child whose edge begins at `token_ids[start]`: its first token, or first page."""
    if page_size == 1:
        return token_ids[start]
    return tuple(token_ids[start : start + page_size])


def common_prefix_tokens(edge: list[int], token_ids: list[int], start: int, limit: int, page_size: int) -> int:
    """Length of the page-aligned common prefix of `edge` and `token_ids[start:limit]`."""
    span = min(len(edge), limit - start)
    if span <= 0:
        return 0
    # The common case is a full-edge match: one C-level comparison instead of a Python loop.
    if edge[:span] == token_ids[start : start + span]:
        same = span
    else:
        same = 0
        while same < span and edge[same] == token_ids[start + same]:
            same += 1
    return same - same % page_size
