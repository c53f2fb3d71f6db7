"""The approximate index: what the router believes one replica caches when its KV events are missing.

`ApproximateIndex` remembers the text blocks the gateway sent to the replica, per namespace (the tenant's cache
salt), aged out by the replica's TTL and capacity (least recently sent first). A lookup only ever sees blocks of the
caller's own namespace, so one tenant's traffic can neither find nor reveal another tenant's placement. (The events
index is `gateway.replicas.event_index`.)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


def leading_matches(hashes: Sequence[int], contains) -> int:
    """How many leading `hashes` satisfy `contains` (a chain stops matching at its first unknown block)."""
    count = 0
    for value in hashes:
        if not contains(value):
            break
        count += 1
    return count


class ApproximateIndex:
    """Text blocks the gateway sent to one replica, per namespace, with their last send time; at most
    `capacity_blocks` across namespaces (least recently sent dropped first) and none older than `ttl_s`."""

    def __init__(self, capacity_blocks: int, ttl_s: float) -> None:
        self.capacity_blocks = capacity_blocks
        self.ttl_s = ttl_s
        self._blocks: OrderedDict[tuple[str, int], float] = OrderedDict()

    def record(self, namespace: str, hashes: Sequence[int], now: float) -> None:
        for value in hashes:
            key = (namespace, value)
            self._blocks[key] = now
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def match_blocks(self, namespace: str, hashes: Sequence[int], now: float) -> int:
        self._expire(now)
        return leading_matches(hashes, lambda h: (namespace, h) in self._blocks)

    def clear(self) -> None:
        self._blocks.clear()

    def num_blocks(self) -> int:
        return len(self._blocks)

    def _expire(self, now: float) -> None:
        deadline = now - self.ttl_s
        while self._blocks:
            key, sent_at = next(iter(self._blocks.items()))
            if sent_at > deadline:
                break
            del self._blocks[key]
