"""The radix tree's changes as per-tier block events (`BlockStored` / `BlockRemoved` / `AllBlocksCleared`).

A block is `block_size` consecutive tokens of a root-to-leaf path, starting at a multiple of `block_size`; it is held
in a tier (`medium`) while every one of its tokens is in a node with a copy in that tier. The tree calls `accounted`
whenever a node's copies may have changed (each `RadixCache.account(node, +1)`), `removed` when a node leaves the
tree and `cleared` when a flush emptied it. A node remembers the tiers it had when last looked at (`kv_tiers`), so
a lock or unlock that changes no copy costs one comparison.

The blocks each node can change are the ones overlapping it: those ending inside it (the first may start in an
ancestor) and, when it ends mid-block, the block that continues into each child. Their tiers are recomputed and
compared with what was announced; the difference is announced, additions before removals (a demotion announces the
host copy before the device copy goes), consecutive blocks of one tier in one `BlockStored` as vLLM groups them.

Block hashes are the engine's namespaced chained hashes (`local_engine.cache.hash_chain`); the namespace also rides
in `extra_keys` of a chain's first block, as vLLM carries `cache_salt`. All methods run under the engine's tree lock;
`announced_events` (a re-announcement after lost events, or a new subscriber's start) also takes this object's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from local_engine.cache.hash_chain import MAX_BLOCK_SIZE, page_hash_chain
from local_engine.kv_events.wire import MEDIUMS, AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

DEFAULT_BLOCK_SIZE = 16  # vLLM's default block size
_ALL_TIERS = 0b111


@dataclass(slots=True)
class _Announced:
    tiers: int  # bit t: held in tier t (0 device, 1 host, 2 disk)
    index: int  # the block's position in its chain (0: the first block of a prompt)
    parent_hash: int | None
    token_ids: tuple[int, ...]


def node_tiers(node) -> int:
    """Bit mask of the tiers holding a copy of `node`'s KV."""
    return sum(1 << tier for tier in range(3) if node.copy_in(tier) is not None)


class BlockEvents:
    """What the engine has announced, per namespace and block, and the events that change it."""

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if not 1 <= block_size <= MAX_BLOCK_SIZE:
            raise ValueError(f"block_size must be between 1 and {MAX_BLOCK_SIZE}")
        self.block_size = block_size
        self._announced: dict[tuple[str, int], _Announced] = {}
        self._sink: Callable[[list[KVCacheEvent]], None] | None = None
        self._lock = threading.Lock()

    def attach(self, sink: Callable[[list[KVCacheEvent]], None]) -> None:
        """Send every later change to `sink` (a publisher's non-blocking `enqueue`)."""
        with self._lock:
            self._sink = sink

    def num_held_blocks(self) -> int:
        """Blocks held in at least one tier."""
        with self._lock:
            return len(self._announced)

    def announced_events(self) -> list[KVCacheEvent]:
        """`AllBlocksCleared` then a `BlockStored` per held block and tier: the whole state, for a subscriber that
        lost events. Parents come before children (blocks are listed in chain order per namespace)."""
        with self._lock:
            items = sorted(self._announced.items(), key=lambda item: item[1].index)
            events: list[KVCacheEvent] = [AllBlocksCleared()]
            size = self.block_size
            for (namespace, block_hash), block in items:
                for tier in range(3):
                    if block.tiers >> tier & 1:
                        first = block.parent_hash is None
                        events.append(BlockStored(
                            [block_hash], block.parent_hash, list(block.token_ids), size, None, MEDIUMS[tier],
                            extra_keys=[(namespace,)] if first and namespace else None,
                        ))
            return events

    # ---- hooks from the tree (under the engine's tree lock) -----------------------------------------------------

    def accounted(self, cache, node) -> None:
        """`node`'s copies or lock changed; announce what that changed for the blocks overlapping it."""
        tiers = node_tiers(node)
        if tiers == node.kv_tiers:
            return
        node.kv_tiers = tiers
        namespace = cache.namespace_of(node)
        path = node.path_token_ids()
        end, size = len(path), self.block_size
        start = end - node.num_tokens
        changes: list[tuple[int, list[int], list[int], int, int]] = []  # (index, path, chain, old, new)
        if end // size > start // size:
            chain = page_hash_chain(namespace, path, size)
            for index in range(start // size, end // size):
                changes.append(self._change(namespace, path, chain, index, node, end))
        if end % size:
            self._crossing(namespace, path, node, end // size, changes)
        self._announce(namespace, [c for c in changes if c[3] != c[4]])

    def removed(self, namespace: str, path_token_ids: Sequence[int], num_removed_tokens: int) -> None:
        """The last `num_removed_tokens` of `path_token_ids` (a root-to-leaf path) left the tree."""
        size = self.block_size
        path = list(path_token_ids)
        first = (len(path) - num_removed_tokens) // size
        if len(path) // size <= first:
            return
        chain = page_hash_chain(namespace, path, size)
        changes = []
        for index in range(first, len(path) // size):
            block = self._announced.get((namespace, chain[index]))
            if block is not None:
                changes.append((index, path, chain, block.tiers, 0))
        self._announce(namespace, changes)

    def cleared(self) -> None:
        """A flush emptied the tree."""
        with self._lock:
            self._announced.clear()
            if self._sink is not None:
                self._sink([AllBlocksCleared()])

    # ---- internals ----------------------------------------------------------------------------------------------

    def _change(self, namespace: str, path: list[int], chain: list[int], index: int, owner, owner_end: int):
        """(index, path, chain, announced tiers, tiers now) of block `index`, which ends inside `owner`."""
        tiers, node, node_end, block_start = _ALL_TIERS, owner, owner_end, index * self.block_size
        while node is not None and not node.is_root and node_end > block_start:
            tiers &= node_tiers(node)
            node_end -= node.num_tokens
            node = node.parent
        block = self._announced.get((namespace, chain[index]))
        return index, path, chain, block.tiers if block is not None else 0, tiers

    def _crossing(self, namespace: str, path: list[int], node, index: int, changes: list) -> None:
        """The block `index` starts inside `node` and ends in a descendant: refresh it along every branch."""
        block_end = (index + 1) * self.block_size
        for child in node.children.values():
            child_path = path + child.key
            if len(child_path) >= block_end:
                chain = page_hash_chain(namespace, child_path[:block_end], self.block_size)
                changes.append(self._change(namespace, child_path, chain, index, child, len(child_path)))
            else:
                self._crossing(namespace, child_path, child, index, changes)

    def _announce(self, namespace: str, changes: list) -> None:
        if not changes:
            return
        size = self.block_size
        events: list[KVCacheEvent] = []
        with self._lock:
            for tier in range(3):  # additions: runs of consecutive blocks of one path in one event
                run: list = []
                for change in changes + [None]:
                    added = change is not None and (change[4] & ~change[3]) >> tier & 1
                    if added and run and (change[0] != run[-1][0] + 1 or change[1] is not run[-1][1]):
                        events.append(self._stored_event(namespace, run, tier))
                        run = []
                    if added:
                        run.append(change)
                    elif run:
                        events.append(self._stored_event(namespace, run, tier))
                        run = []
            for tier in range(3):
                gone = [c[2][c[0]] for c in changes if (c[3] & ~c[4]) >> tier & 1]
                if gone:
                    events.append(BlockRemoved(gone, MEDIUMS[tier]))
            for index, path, chain, _, tiers in changes:
                key = (namespace, chain[index])
                if tiers:
                    parent = chain[index - 1] if index else None
                    tokens = tuple(path[index * size : (index + 1) * size])
                    self._announced[key] = _Announced(tiers, index, parent, tokens)
                else:
                    self._announced.pop(key, None)
            if events and self._sink is not None:
                self._sink(events)

    def _stored_event(self, namespace: str, run: list, tier: int) -> BlockStored:
        first, path, chain = run[0][0], run[0][1], run[0][2]
        last = run[-1][0]
        size = self.block_size
        extra = [(namespace,)] + [None] * (len(run) - 1) if first == 0 and namespace else None
        return BlockStored(
            [chain[i] for i in range(first, last + 1)], chain[first - 1] if first else None,
            path[first * size : (last + 1) * size], size, None, MEDIUMS[tier], extra_keys=extra,
        )
