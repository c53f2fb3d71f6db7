"""What the router believes one replica's prefix cache holds, per namespace (the tenant's cache salt).

`PreciseIndex` mirrors the engine's published cache events (token blocks, the engine's own hash chain); blocks the
router just sent there count as pending until the events confirm them, so a burst of requests with a new prefix
sticks to one replica before the first event arrives. `ApproximateIndex` remembers the text blocks the gateway sent,
aged out by the replica's TTL and capacity (least recently sent first).

Namespaces never mix: a lookup only ever sees blocks of the caller's own namespace, and every hash already covers
its namespace, so one tenant's traffic can neither find nor reveal another tenant's placement.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


def leading_matches(hashes: Sequence[int], contains) -> int:
    """How many leading `hashes` satisfy `contains` (a chain stops matching at its first unknown block)."""
    count = 0
    for value in hashes:
        if not contains(value):
            break
        count += 1
    return count


class PreciseIndex:
    """Blocks held per namespace, as the engine's events say (`stored`, `removed`, `cleared`, or a snapshot)."""

    def __init__(self) -> None:
        self.held: dict[str, set[int]] = {}
        self._pending: dict[str, dict[int, float]] = {}  # namespace -> block -> expiry (monotonic seconds)

    def reset(self, namespaces: dict[str, Iterable[int]]) -> None:
        self.held = {namespace: set(hashes) for namespace, hashes in namespaces.items()}

    def apply(self, event: dict) -> None:
        kind, namespace, hashes = event.get("kind"), event.get("namespace"), event.get("block_hashes") or ()
        if kind == "cleared":
            self.held.clear()
            self._pending.clear()
        elif kind == "stored" and isinstance(namespace, str):
            self.held.setdefault(namespace, set()).update(hashes)
            pending = self._pending.get(namespace)
            if pending:
                for value in hashes:
                    pending.pop(value, None)
        elif kind == "removed" and isinstance(namespace, str):
            held = self.held.get(namespace)
            if held is not None:
                held.difference_update(hashes)
            pending = self._pending.get(namespace)
            if pending:
                for value in hashes:
                    pending.pop(value, None)

    def holds_namespace(self, namespace: str) -> bool:
        """Whether the engine's events say it holds any block of `namespace`."""
        return bool(self.held.get(namespace))

    def expect(self, namespace: str, hashes: Sequence[int], expires_at: float) -> None:
        """The router sent these blocks here: count them as held until `expires_at` unless events say otherwise."""
        pending = self._pending.setdefault(namespace, {})
        held = self.held.get(namespace, ())
        for value in hashes:
            if value not in held:
                pending[value] = expires_at

    def match_blocks(self, namespace: str, hashes: Sequence[int], now: float) -> int:
        held = self.held.get(namespace, ())
        pending = self._pending.get(namespace, {})
        return leading_matches(hashes, lambda h: h in held or pending.get(h, 0.0) > now)

    def num_blocks(self) -> int:
        return sum(len(hashes) for hashes in self.held.values())


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
