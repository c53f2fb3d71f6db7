"""What one replica's KV events say it caches, indexed by token ids (not by the engine's hash function).

Each announced block gets a router key: a chain over the namespace and the block's token ids (key of block i =
hash(key of block i-1, its tokens)), so a request's prompt, tokenized by the gateway and cut into blocks of the
events' block size, finds the replica's blocks without reproducing the engine's hashes (vLLM's SHA-256 or CBOR
hashes, SGLang's, prefixscope's). The engine's hashes only link a `BlockStored` to its parent and name what a
`BlockRemoved` takes away. Per block, the index keeps the tiers holding it; a match counts the leading blocks held in
any tier and weighs each by its fastest tier (`TIER_WEIGHTS`), so a device hit outscores a host or disk one.

Namespaces never mix: the first key of a chain covers its namespace, so one tenant's prompt cannot match (or reveal)
another's blocks. Blocks the router just sent to this replica count as pending until the events confirm them (or
`pending` seconds pass), so a burst of requests with a new prefix sticks to one replica.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

from gateway.replicas.kv_event_wire import Cleared, Event, Removed, Stored

TIER_WEIGHTS = (1.0, 0.8, 0.5)  # device, host, disk: what a block saves, relative to a device hit (load-back cost)
_MAX_PENDING = 100_000
_BEST_TIER = tuple(min((t for t in range(3) if mask >> t & 1), default=3) for mask in range(8))


def block_keys(namespace: str, token_ids: Sequence[int], block_size: int) -> list[int]:
    """Router keys of the full blocks of `token_ids` (a trailing partial block has none)."""
    keys, previous = [], hash(("ns", namespace))
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        previous = hash((previous, *token_ids[start : start + block_size]))
        keys.append(previous)
    return keys


class EventIndex:
    """One replica's blocks as its events describe them. Not thread-safe: used from the gateway's event loop."""

    def __init__(self) -> None:
        self.block_size: int | None = None  # from the events (None until the first BlockStored)
        self._tiers: dict[int, int] = {}  # router key -> bit mask of tiers holding the block
        # engine block hash -> router key, and router key -> namespace (two maps of atoms rather than one of tuples:
        # the garbage collector then never walks them, which keeps decisions free of long pauses)
        self._engine: dict[object, int] = {}
        self._key_namespace: dict[int, str] = {}
        self._namespaces: Counter[str] = Counter()  # blocks held per namespace
        self._pending: dict[int, float] = {}  # router key -> until (monotonic seconds)
        self.orphans = 0  # stored blocks whose parent this index never saw (skipped)
        self.unindexed = 0  # stored blocks in a medium this router does not index

    # ---- events -------------------------------------------------------------------------------------------------

    def apply(self, events: Sequence[Event]) -> None:
        for event in events:
            if isinstance(event, Stored):
                self._stored(event)
            elif isinstance(event, Removed):
                self._removed(event)
            elif isinstance(event, Cleared):
                self.clear()

    def clear(self) -> None:
        self._tiers.clear()
        self._engine.clear()
        self._key_namespace.clear()
        self._namespaces.clear()
        self._pending.clear()

    def _stored(self, event: Stored) -> None:
        if event.tier is None:
            self.unindexed += len(event.block_hashes)
            return
        if self.block_size != event.block_size:
            if self.block_size is not None:
                self.clear()  # another block size: the engine was reconfigured
            self.block_size = event.block_size
        if event.parent_hash is None:
            namespace, previous = event.namespace or "", hash(("ns", event.namespace or ""))
        else:
            previous = self._engine.get(event.parent_hash)
            if previous is None:
                self.orphans += len(event.block_hashes)
                return
            namespace = self._key_namespace[previous]
        size, bit = event.block_size, 1 << event.tier
        for i, engine_hash in enumerate(event.block_hashes):
            key = hash((previous, *event.token_ids[i * size : (i + 1) * size]))
            tiers = self._tiers.get(key, 0)
            if not tiers:
                self._namespaces[namespace] += 1
                self._key_namespace[key] = namespace
            self._tiers[key] = tiers | bit
            self._engine[engine_hash] = key
            self._pending.pop(key, None)
            previous = key

    def _removed(self, event: Removed) -> None:
        if event.tier is None:
            return
        bit = 1 << event.tier
        for engine_hash in event.block_hashes:
            key = self._engine.get(engine_hash)
            if key is None:
                continue
            tiers = self._tiers.get(key, 0) & ~bit
            if tiers:
                self._tiers[key] = tiers
                continue
            self._tiers.pop(key, None)
            del self._engine[engine_hash]
            namespace = self._key_namespace.pop(key, "")
            self._namespaces[namespace] -= 1
            if self._namespaces[namespace] <= 0:
                del self._namespaces[namespace]

    # ---- lookups ------------------------------------------------------------------------------------------------

    def expect(self, keys: Sequence[int], until: float) -> None:
        """The router sent these blocks here: count them as held (on the device) until `until`."""
        if len(self._pending) > _MAX_PENDING:
            now = time.monotonic()
            self._pending = {key: t for key, t in self._pending.items() if t > now}
        for key in keys:
            if key not in self._tiers:
                self._pending[key] = until

    def match(self, keys: Sequence[int], now: float) -> tuple[int, float]:
        """(leading blocks held in any tier or pending, the same weighted by each block's fastest tier)."""
        tiers, pending = self._tiers, self._pending
        count, weighted = 0, 0.0
        for key in keys:
            mask = tiers.get(key)
            if mask:
                weighted += TIER_WEIGHTS[_BEST_TIER[mask]]
            elif pending.get(key, 0.0) > now:
                weighted += TIER_WEIGHTS[0]
            else:
                break
            count += 1
        return count, weighted

    def holds_namespace(self, namespace: str) -> bool:
        return self._namespaces.get(namespace, 0) > 0

    def num_blocks(self) -> int:
        return len(self._tiers)

    def blocks_per_tier(self) -> dict[str, int]:
        counts = [0, 0, 0]
        for mask in self._tiers.values():
            for tier in range(3):
                counts[tier] += mask >> tier & 1
        return {"device": counts[0], "host": counts[1], "disk": counts[2]}
