"""The replay loops. `db.simulation.simulator` documents the cache model they share; `lru` and `fifo` replay through
that model itself (`db.cache_model.PrefixCacheModel`), `optimal` needs the trace's future and keeps its own loop.

Each loop does, per request in time order: drop blocks idle for more than the TTL; count the leading cached blocks
(the hit); take the request's first `capacity` blocks (its "admitted" blocks, all of them unless the request is longer
than the cache); evict, by the policy, as many blocks outside the admitted ones as the missing admitted blocks need
(for a request longer than the cache that is every other block, its own deeper ones included); insert and touch the
admitted blocks from the deepest to the first, so that among one request's blocks the deepest counts as the oldest
(evicted first, as an engine frees a radix tree's leaves first). Everything is plain ints in dicts, an
OrderedDict in recency or insertion order, and for `optimal` a heap of ints with lazy deletion.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import NamedTuple

from db.cache_model import PrefixCacheModel
from db.simulation.trace import Trace


class ReplayCounts(NamedTuple):
    hit_tokens: int
    hit_blocks: int
    hit_requests: int
    evicted_blocks: int
    expired_blocks: int


class NextUse(NamedTuple):
    """For each flat block position g: where its hash occurs next (`positions[g]`, or the trace's block count when it
    never does) and the time of the request holding that occurrence (`times_s[g]`, infinity when none)."""

    positions: list[int]
    times_s: list[float]


def next_uses(trace: Trace) -> NextUse:
    """The next occurrence of every block of `trace`, from one backward scan (chains never repeat a hash, so the
    next occurrence is always in a later request)."""
    hashes, offsets, times = trace.hashes, trace.offsets, trace.timestamps_s
    total = len(hashes)
    positions = [total] * total
    block_time = [0.0] * total
    for request in range(trace.num_requests):
        block_time[offsets[request] : offsets[request + 1]] = [times[request]] * (
            offsets[request + 1] - offsets[request]
        )
    seen: dict[int, int] = {}
    for position in range(total - 1, -1, -1):
        key = hashes[position]
        later = seen.get(key)
        if later is not None:
            positions[position] = later
        seen[key] = position
    infinity = float("inf")
    times_s = [block_time[later] if later < total else infinity for later in positions]
    return NextUse(positions, times_s)


def _drop_idle(touched: OrderedDict[int, float], store: dict, now: float, ttl_s: float) -> int:
    """Drop the hashes idle for more than `ttl_s` from `touched` (oldest first) and from `store`; how many went."""
    dropped = 0
    while touched:
        oldest, last = next(iter(touched.items()))
        if not now - last > ttl_s:
            break
        del touched[oldest]
        store.pop(oldest, None)  # a no-op when `store` is `touched` itself (LRU)
        dropped += 1
    return dropped


def _leading_hits(hashes: tuple[int, ...], start: int, end: int, store: dict) -> int:
    """How many of the request's blocks, from its first, are cached: a prefix cache stops at the first miss."""
    hits = 0
    for position in range(start, end):
        if hashes[position] not in store:
            break
        hits += 1
    return hits


def replay_lru(trace: Trace, capacity: int, ttl_s: float | None) -> ReplayCounts:
    """Least recently used, through the shared prefix-cache model (`db.cache_model`)."""
    return _replay_model(trace, PrefixCacheModel(capacity, policy="lru", ttl_s=ttl_s))


def replay_fifo(trace: Trace, capacity: int, ttl_s: float | None) -> ReplayCounts:
    """First in, first out (a hit does not refresh a block), through the shared prefix-cache model."""
    return _replay_model(trace, PrefixCacheModel(capacity, policy="fifo", ttl_s=ttl_s))


def _replay_model(trace: Trace, model: PrefixCacheModel) -> ReplayCounts:
    hashes, offsets, lengths, size = trace.hashes, trace.offsets, trace.input_lengths, trace.block_size
    hit_tokens = hit_blocks = hit_requests = 0
    for request, now in enumerate(trace.timestamps_s):
        model.expire(now)
        chain = hashes[offsets[request] : offsets[request + 1]]
        hits = model.leading_hits(chain)
        if hits:
            hit_blocks += hits
            hit_tokens += min(hits * size, lengths[request])
            hit_requests += 1
        model.admit(chain, now)
    return ReplayCounts(hit_tokens, hit_blocks, hit_requests, model.evicted_blocks, model.expired_blocks)


def replay_optimal(trace: Trace, capacity: int, ttl_s: float | None, next_use: NextUse) -> ReplayCounts:
    """Belady: evict the block whose next use is furthest away.

    A block's key is the flat position of its next occurrence (so a later request, then a deeper block of the same
    request, is further). A block with no next use, or one it will not reach before the TTL drops it, is dead: its key
    is `total + g` (g its last position), above every live key. Keys are unique, so the heap holds bare negated keys,
    and a popped key names its own hash (`hashes[key]` or `hashes[key - total]`); a key that is no longer its hash's
    current key is stale and skipped.
    """
    hashes, offsets, lengths, size = trace.hashes, trace.offsets, trace.input_lengths, trace.block_size
    next_index, next_time = next_use
    total = len(hashes)
    current: dict[int, int] = {}  # cached hash -> its key
    heap: list[int] = []  # negated keys: the furthest next use on top
    touched: OrderedDict[int, float] = OrderedDict()
    hit_tokens = hit_blocks = hit_requests = evicted = expired = 0
    for request, now in enumerate(trace.timestamps_s):
        if ttl_s is not None:
            expired += _drop_idle(touched, current, now, ttl_s)
        start, end = offsets[request], offsets[request + 1]
        hits = _leading_hits(hashes, start, end, current)
        if hits:
            hit_blocks += hits
            hit_tokens += min(hits * size, lengths[request])
            hit_requests += 1
        admitted = min(end, start + capacity)
        missing = sum(1 for position in range(start, admitted) if hashes[position] not in current)
        need = len(current) + missing - capacity
        if need > 0:
            pinned = set(hashes[start:admitted])
            evicted += need
            while need:
                key = -heapq.heappop(heap)
                block = hashes[key] if key < total else hashes[key - total]
                # The admitted blocks' entries are dropped: they get fresh keys just below.
                if current.get(block) != key or block in pinned:
                    continue
                del current[block]
                touched.pop(block, None)
                need -= 1
        for position in range(start, admitted):
            block = hashes[position]
            later = next_index[position]
            if later == total or (ttl_s is not None and next_time[position] - now > ttl_s):
                key = total + position
            else:
                key = later
            current[block] = key
            heapq.heappush(heap, -key)
        if ttl_s is not None:
            for position in range(admitted - 1, start - 1, -1):
                touched[hashes[position]] = now
                touched.move_to_end(hashes[position])
        if len(heap) > 2 * len(current) + 1024:
            heap = [-key for key in current.values()]
            heapq.heapify(heap)
    return ReplayCounts(hit_tokens, hit_blocks, hit_requests, evicted, expired)
