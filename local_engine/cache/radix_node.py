"""One node of the radix tree: a compressed edge of token ids and the pool slots that hold their KV."""

from __future__ import annotations

import itertools
from typing import Hashable

import torch

_node_ids = itertools.count(1)


class RadixNode:
    """`key` (token ids) and `slots` (int64 `[len(key)]`) always have equal length; the root's are empty.

    `lock_ref` counts the requests using this node (and therefore every ancestor); a node with `lock_ref > 0` is
    protected from eviction.
    """

    __slots__ = ("node_id", "parent", "key", "slots", "children", "lock_ref", "last_access_s", "created_s", "hit_count")

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

    @property
    def num_tokens(self) -> int:
        return len(self.key)

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
