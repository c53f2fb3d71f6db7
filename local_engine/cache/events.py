"""Cache events: what the prefix cache stored and removed, as block hashes, for routers that follow it.

Each event names blocks by the same namespaced chained hashes as `hash_chain.page_hash_chain` (block `i` covers the
namespace and every token up to the end of block `i`), so a router that hashes a request's prompt the same way knows
which replicas hold which of its blocks. Events carry consecutive sequence numbers; a follower that asks for events
after a cursor older than the retained window gets `gap: true` and rebuilds from `snapshot()`. The `epoch` is a
random id per process: a restarted engine starts a new epoch, so a follower knows its cursor means nothing there.

Kinds (the shape of vLLM's and Dynamo's KV events, reduced to what a router needs):
`stored` (namespace, block hashes now held), `removed` (namespace, block hashes gone), `cleared` (nothing held).
A block counts as held only while every one of its tokens is in the tree.

The log is written under the engine's tree lock and read from the HTTP side, so it has its own small lock.
"""

from __future__ import annotations

import secrets
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from local_engine.cache.hash_chain import MAX_BLOCK_SIZE, page_hash_chain

DEFAULT_EVENT_BLOCK_SIZE = 16
DEFAULT_EVENT_CAPACITY = 10_000


@dataclass(frozen=True, slots=True)
class CacheEvent:
    seq: int
    kind: str  # stored | removed | cleared
    namespace: str | None
    block_hashes: tuple[int, ...]

    def as_dict(self) -> dict:
        hashes = list(self.block_hashes)
        return {"seq": self.seq, "kind": self.kind, "namespace": self.namespace, "block_hashes": hashes}


class CacheEventLog:
    """A bounded, numbered log of block events plus the set of blocks held now (for snapshots)."""

    def __init__(self, block_size: int = DEFAULT_EVENT_BLOCK_SIZE, capacity: int = DEFAULT_EVENT_CAPACITY) -> None:
        if not 1 <= block_size <= MAX_BLOCK_SIZE:
            raise ValueError(f"block_size must be between 1 and {MAX_BLOCK_SIZE}")
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self.block_size = block_size
        self.epoch = secrets.token_hex(8)
        self._events: deque[CacheEvent] = deque(maxlen=capacity)
        self._held: dict[str, set[int]] = {}
        self._seq = 0
        self._lock = threading.Lock()

    # ---- writing (from the cache, under the engine's tree lock) -------------------------------------------------

    def stored(self, namespace: str, token_ids: Sequence[int], num_cached_tokens: int) -> None:
        """`token_ids` are now in the tree, of which the first `num_cached_tokens` were already there."""
        size = self.block_size
        first = num_cached_tokens // size  # the first block not yet wholly held
        if len(token_ids) // size <= first:
            return
        hashes = page_hash_chain(namespace, list(token_ids), size)[first:]
        with self._lock:
            held = self._held.setdefault(namespace, set())
            new = tuple(h for h in hashes if h not in held)
            if new:
                held.update(new)
                self._append("stored", namespace, new)

    def removed(self, namespace: str, path_token_ids: Sequence[int], num_removed_tokens: int) -> None:
        """The last `num_removed_tokens` of `path_token_ids` (a root-to-leaf path) left the tree."""
        size = self.block_size
        start = len(path_token_ids) - num_removed_tokens
        first = start // size  # blocks ending after `start` lost at least one token
        if len(path_token_ids) // size <= first:
            return
        hashes = page_hash_chain(namespace, list(path_token_ids), size)[first:]
        with self._lock:
            held = self._held.get(namespace, set())
            gone = tuple(h for h in hashes if h in held)
            if gone:
                held.difference_update(gone)
                if not held:
                    self._held.pop(namespace, None)
                self._append("removed", namespace, gone)

    def cleared(self) -> None:
        """Nothing is held any more (a flush that emptied the tree)."""
        with self._lock:
            self._held.clear()
            self._append("cleared", None, ())

    def _append(self, kind: str, namespace: str | None, hashes: tuple[int, ...]) -> None:
        self._seq += 1
        self._events.append(CacheEvent(self._seq, kind, namespace, hashes))

    # ---- reading (HTTP side) ------------------------------------------------------------------------------------

    def since(self, after_seq: int, limit: int) -> dict:
        """Events with `seq > after_seq`, oldest first, at most `limit`. `gap` is true when some of the events the
        caller has not seen are no longer retained (or `after_seq` is ahead of this log: another epoch)."""
        with self._lock:
            last = self._seq
            oldest = self._events[0].seq if self._events else last + 1
            gap = after_seq > last or (after_seq < oldest - 1 and after_seq < last)
            events = [] if gap else [e.as_dict() for e in self._events if e.seq > after_seq][:limit]
        return {
            "epoch": self.epoch,
            "block_size": self.block_size,
            "last_seq": last,
            "gap": gap,
            "events": events,
        }

    def snapshot(self) -> dict:
        """Every held block per namespace, as of `seq` (follow with `since(seq)`)."""
        with self._lock:
            return {
                "epoch": self.epoch,
                "block_size": self.block_size,
                "seq": self._seq,
                "namespaces": {ns: sorted(hashes) for ns, hashes in self._held.items() if hashes},
            }

    def num_held_blocks(self) -> int:
        with self._lock:
            return sum(len(hashes) for hashes in self._held.values())
