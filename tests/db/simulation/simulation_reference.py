"""Brute-force replays of the cache model in `db.simulation.simulator`, one level and two, for tests only.

Lists and linear scans, every choice spelled out: each cached block is an entry with its recency and insertion
stamps; LRU and FIFO pick the smallest stamp, Belady scans the future requests for each candidate's next use. It shares
nothing with the fast replay but the `Trace` it reads and the counts it returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from db.simulation.policies import ReplayCounts
from db.simulation.stack import TierCounts
from db.simulation.trace import Trace


@dataclass
class _Entry:
    block: int
    last_touch_s: float
    last_position: int  # flat position of the last touch, breaks ties between blocks never used again
    recency: int
    inserted: int


def _find(cache: list[_Entry], block: int) -> _Entry | None:
    return next((entry for entry in cache if entry.block == block), None)


def _future_key(trace: Trace, request: int, entry: _Entry, ttl_s: float | None) -> tuple[float, int]:
    """(request, position) of the entry's next use after `request`; (inf, last position) if none usable."""
    for later in range(request + 1, trace.num_requests):
        chain = trace.hashes[trace.offsets[later] : trace.offsets[later + 1]]
        if entry.block in chain:
            if ttl_s is not None and trace.timestamps_s[later] - entry.last_touch_s > ttl_s:
                break
            return (later, chain.index(entry.block))
    return (math.inf, entry.last_position)


def reference_replay(trace: Trace, capacity_tokens: int | None, policy: str, ttl_s: float | None) -> ReplayCounts:
    capacity = trace.num_blocks if capacity_tokens is None else capacity_tokens // trace.block_size
    cache: list[_Entry] = []
    stamp = 0
    hit_tokens = hit_blocks = hit_requests = evicted = expired = 0
    for request in range(trace.num_requests):
        now = trace.timestamps_s[request]
        start = trace.offsets[request]
        chain = list(trace.hashes[start : trace.offsets[request + 1]])
        if ttl_s is not None:
            kept = [entry for entry in cache if not now - entry.last_touch_s > ttl_s]
            expired += len(cache) - len(kept)
            cache = kept

        hits = 0
        for block in chain:
            if _find(cache, block) is None:
                break
            hits += 1
        hit_blocks += hits
        hit_tokens += min(hits * trace.block_size, trace.input_lengths[request])
        hit_requests += hits > 0

        admitted, deeper = chain[:capacity], chain[capacity:]
        before = len(cache)
        cache = [entry for entry in cache if entry.block not in deeper]
        evicted += before - len(cache)
        missing = [block for block in admitted if _find(cache, block) is None]
        while len(cache) + len(missing) > capacity:
            candidates = [entry for entry in cache if entry.block not in admitted]
            if policy == "lru":
                victim = min(candidates, key=lambda entry: entry.recency)
            elif policy == "fifo":
                victim = min(candidates, key=lambda entry: entry.inserted)
            else:
                victim = max(candidates, key=lambda entry: _future_key(trace, request, entry, ttl_s))
            cache.remove(victim)
            evicted += 1
        for offset in range(len(admitted) - 1, -1, -1):
            stamp += 1
            entry = _find(cache, admitted[offset])
            if entry is None:
                entry = _Entry(admitted[offset], now, start + offset, stamp, stamp)
                cache.append(entry)
            entry.last_touch_s, entry.last_position, entry.recency = now, start + offset, stamp
    return ReplayCounts(hit_tokens, hit_blocks, hit_requests, evicted, expired)


@dataclass
class _Block:
    block: int
    last_touch_s: float
    recency: int


def reference_replay_tiers(
    trace: Trace, capacity_tokens: int | None, host_capacity_tokens: int | None, ttl_s: float | None
) -> TierCounts:
    """A device list and a host list, moved block by block: every touch puts the block on the device (from the host
    if it was there, a promotion); a device over capacity demotes its least recent block to the host; a host over
    capacity drops its least recent block. A request touches its blocks deepest first. Idle blocks expire from either
    list. Evicted: blocks cached when the request came (after expiry) and gone once it was served."""
    infinite = math.inf
    device_room = infinite if capacity_tokens is None else capacity_tokens // trace.block_size
    host_room = infinite if host_capacity_tokens is None else host_capacity_tokens // trace.block_size
    device: list[_Block] = []
    host: list[_Block] = []
    stamp = 0
    hit_tokens = hit_blocks = hit_requests = evicted = expired = 0
    device_tokens = device_blocks = host_tokens = host_blocks = 0
    for request in range(trace.num_requests):
        now = trace.timestamps_s[request]
        chain = list(trace.hashes[trace.offsets[request] : trace.offsets[request + 1]])
        length = trace.input_lengths[request]
        if ttl_s is not None:
            for tier in (device, host):
                kept = [entry for entry in tier if not now - entry.last_touch_s > ttl_s]
                expired += len(tier) - len(kept)
                tier[:] = kept

        hits = 0
        for block in chain:
            on_device = any(entry.block == block for entry in device)
            on_host = any(entry.block == block for entry in host)
            if not (on_device or on_host):
                break
            tokens = min((hits + 1) * trace.block_size, length) - min(hits * trace.block_size, length)
            hits += 1
            if on_device:
                device_blocks += 1
                device_tokens += tokens
            else:
                host_blocks += 1
                host_tokens += tokens
        hit_blocks += hits
        hit_tokens += min(hits * trace.block_size, length)
        hit_requests += hits > 0

        cached_before = {entry.block for entry in device + host}
        for block in reversed(chain):
            stamp += 1
            entry = next((entry for entry in device + host if entry.block == block), None)
            if entry is None:
                entry = _Block(block, now, stamp)
            elif entry in host:
                host.remove(entry)  # a host hit moves back to the device
            else:
                device.remove(entry)
            entry.last_touch_s, entry.recency = now, stamp
            device.append(entry)
            if len(device) > device_room:
                victim = min(device, key=lambda item: item.recency)
                device.remove(victim)
                host.append(victim)  # demoted
            if len(host) > host_room:
                host.remove(min(host, key=lambda item: item.recency))
        evicted += len(cached_before - {entry.block for entry in device + host})
    return TierCounts(
        hit_tokens,
        hit_blocks,
        hit_requests,
        evicted,
        expired,
        device_tokens,
        device_blocks,
        host_tokens,
        host_blocks,
    )
