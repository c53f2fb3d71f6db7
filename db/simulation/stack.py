"""The whole LRU hit curve, every capacity at once, from one pass over a trace (stack distances).

Mattson, Gecsei, Slutz and Traiger, "Evaluation techniques for storage hierarchies" (IBM Systems Journal 9(2), 1970):
LRU has the inclusion property, so at every moment a cache of C blocks holds exactly the C most recently used blocks.
A block's *stack distance* d (1 + the number of distinct blocks used since its last use) therefore says at once for
every capacity whether it is cached: it is iff d <= C. Distances are counted with a Fenwick tree over access times
holding a 1 at each block's latest access, as in Bennett and Kruskal, "LRU stack processing" (IBM J. R&D 19(4), 1975)
and Olken, "Efficient methods for calculating the success function of fixed space replacement policies" (LBL-12370,
1981): d = 1 + the number of 1s after the block's previous access, O(log n) per query.

How this maps onto the simulator's model (`db.simulation.simulator`), which `tests/db/simulation` checks exactly
against a brute-force replay at every capacity:

- A request touches its blocks deepest first, so its first block ends on top of the stack. Cutting a request longer
  than the cache to its first C blocks is then what LRU does anyway: the top C of the stack are those blocks.
- Lookups happen before the request's own touches, so every block of a request gets its distance against the stack
  as the request found it. The request hits its leading blocks at capacity C while their *prefix maximum* distance
  m_k = max(d_0..d_k) is at most C; hit blocks, hit tokens and requests with a hit at C are sums over m_k <= C.
- A TTL drops the blocks idle too long. Access times grow with wall time, so they are always the bottom of the stack:
  a block is live iff its last access is at or after a moving floor, and an expired block counts as never seen.
  At capacity C an expiry is counted when the block was among the top C, i.e. its depth at expiry is at most C.
- Evictions at C = blocks inserted at C (admitted positions i < C missing at C: i < C < d_i) - blocks still cached at
  the end - blocks expired at C, since every block that left the cache was either evicted or expired.
- Two levels with demotion (an L1 victim moves to L2, an L2 hit moves back to L1) are one LRU of C1 + C2 blocks whose
  top C1 sit in L1: a hit block is a device hit when d <= C1, a host hit when C1 < d and its prefix fits in C1 + C2.

Speed: a chained block's parent is touched right after it in every request, so a request's blocks come in runs of
consecutive access times; one Fenwick query and one range update per run serve every block in it (d grows by one per
block of a run). Each function of C is kept as a second-order difference array, so a run adds O(1) entries.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import ge
from typing import NamedTuple

from db.simulation.trace import Trace


class TierCounts(NamedTuple):
    """A replay's counts (as `ReplayCounts`) plus the split of the hits between the device (L1) and host (L2) tiers."""

    hit_tokens: int
    hit_blocks: int
    hit_requests: int
    evicted_blocks: int
    expired_blocks: int
    device_hit_tokens: int
    device_hit_blocks: int
    host_hit_tokens: int
    host_hit_blocks: int


class _RangeFenwick:
    """Prefix sums under range additions over indices 1..size (two Fenwick trees, the usual construction)."""

    __slots__ = ("_size", "_linear", "_offset")

    def __init__(self, size: int) -> None:
        self._size = size
        self._linear = [0] * (size + 1)
        self._offset = [0] * (size + 1)

    def add(self, first: int, last: int, value: int) -> None:
        """Add `value` at every index in [first, last]."""
        self._point(first, value, value * (first - 1))
        if last < self._size:
            self._point(last + 1, -value, -value * last)

    def _point(self, index: int, linear: int, offset: int) -> None:
        size, tree_linear, tree_offset = self._size, self._linear, self._offset
        while index <= size:
            tree_linear[index] += linear
            tree_offset[index] += offset
            index += index & -index

    def prefix(self, index: int) -> int:
        """The sum over indices 1..index."""
        linear = offset = 0
        position = index
        tree_linear, tree_offset = self._linear, self._offset
        while position > 0:
            linear += tree_linear[position]
            offset += tree_offset[position]
            position -= position & -position
        return linear * index - offset


@dataclass(frozen=True, slots=True)
class _Sparse:
    """Hit blocks whose own distance is below their prefix's maximum (only in traces that are not hash chains):
    `count` blocks at distances first_distance, first_distance + 1, ..., all hit iff `max_distance` <= C1 + C2,
    each worth `tokens` tokens."""

    first_distance: int
    count: int
    max_distance: int
    tokens: int


@dataclass(frozen=True, slots=True, eq=False)
class LruCurve:
    """LRU figures at every capacity in blocks from 0 to `max_blocks` (larger capacities equal `max_blocks`).

    Lists are indexed by capacity in blocks: `hit_blocks[c]` is the hit blocks of an LRU cache of c blocks.
    `device_blocks[c]` / `device_tokens[c]` count the hits at distance <= c whose prefix maximum is the block's own
    distance; `sparse` holds the rest. Build one with `lru_curve`.
    """

    block_size: int
    ttl_s: float | None
    max_blocks: int
    hit_blocks: list[int]
    hit_tokens: list[int]
    hit_requests: list[int]
    inserted_blocks: list[int]
    expired_blocks: list[int]
    device_blocks: list[int]
    device_tokens: list[int]
    sparse: tuple[_Sparse, ...]
    final_live_blocks: int

    def counts(self, capacity_blocks: int | None, host_capacity_blocks: int | None = 0) -> TierCounts:
        """The counts of an LRU cache of `capacity_blocks` on the device and `host_capacity_blocks` on the host
        (None: unlimited), with demotion from one to the other; `host_capacity_blocks=0` is a single-level cache."""
        device = self._clamp(capacity_blocks)
        if capacity_blocks is None or host_capacity_blocks is None:
            total = self.max_blocks
        else:
            total = self._clamp(capacity_blocks + host_capacity_blocks)
        hit_blocks, hit_tokens = self.hit_blocks[total], self.hit_tokens[total]
        device_blocks, device_tokens = self.device_blocks[device], self.device_tokens[device]
        for run in self.sparse:
            if run.max_distance <= total:
                cached = min(max(device - run.first_distance + 1, 0), run.count)
                device_blocks += cached
                device_tokens += cached * run.tokens
        expired = self.expired_blocks[total]
        evicted = self.inserted_blocks[total] - min(total, self.final_live_blocks) - expired
        return TierCounts(
            hit_tokens=hit_tokens,
            hit_blocks=hit_blocks,
            hit_requests=self.hit_requests[total],
            evicted_blocks=evicted,
            expired_blocks=expired,
            device_hit_tokens=device_tokens,
            device_hit_blocks=device_blocks,
            host_hit_tokens=hit_tokens - device_tokens,
            host_hit_blocks=hit_blocks - device_blocks,
        )

    def _clamp(self, blocks: int | None) -> int:
        if blocks is None:
            return self.max_blocks
        if blocks < 0:
            raise ValueError(f"a cache capacity cannot be negative, got {blocks} blocks")
        return min(blocks, self.max_blocks)


class _Curves:
    """Second-order difference arrays over capacities 0..size-1: `ramp(name, lo, hi, v)` adds v to the first-order
    difference at each index in [lo, hi), i.e. v to the function at every C >= i for each such i."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.arrays = {
            name: [0] * (size + 1)
            for name in ("blocks", "tokens", "requests", "inserted", "expired", "device_blocks", "device_tokens")
        }

    def ramp(self, name: str, lo: int, hi: int, value: int) -> None:
        size = self.size
        if lo >= size or hi <= lo:
            return
        array = self.arrays[name]
        array[lo] += value
        array[min(hi, size)] -= value

    def functions(self) -> dict[str, list[int]]:
        return {
            name: list(accumulate(accumulate(array[: self.size]))) for name, array in self.arrays.items()
        }


def lru_curve(trace: Trace, ttl_s: float | None = None) -> LruCurve:
    """One pass over `trace`: LRU's counts at every capacity, single-level and two-level, with `ttl_s` (None: none).

    O(n + r log n) for n blocks in r runs of consecutive access times (one run per request and shared prefix in a
    trace of hash chains), O(n log n) at worst. Raises ValueError for a negative TTL.
    """
    if ttl_s is not None and ttl_s < 0:
        raise ValueError(f"a TTL cannot be negative, got {ttl_s}s")
    hashes, offsets, lengths, size = trace.hashes, trace.offsets, trace.input_lengths, trace.block_size
    times = trace.timestamps_s
    max_blocks = len(set(hashes))
    curves = _Curves(max_blocks + 2)
    ramp = curves.ramp
    sparse: list[_Sparse] = []
    fenwick = _RangeFenwick(len(hashes))
    last: dict[int, int] = {}  # hash -> its latest access time (1-based); 0 stands for never
    first_access: list[int] = []  # per request: the access time of its deepest block
    clock = 0  # the latest access time handed out
    floor = 1  # access times below it have expired
    oldest = 0  # the first request whose accesses may still be live
    for request, now in enumerate(times):
        start, end = offsets[request], offsets[request + 1]
        first_access.append(clock + 1)
        if ttl_s is not None:
            while oldest < request and now - times[oldest] > ttl_s:
                oldest += 1
            new_floor = first_access[oldest]
            if new_floor > floor:
                below = fenwick.prefix(floor - 1)
                expiring = fenwick.prefix(new_floor - 1) - below
                if expiring:
                    live = fenwick.prefix(clock) - below
                    # The expiring blocks are the bottom `expiring` of `live`: depths live - expiring + 1 .. live.
                    ramp("expired", live - expiring + 1, live + 1, 1)
                floor = new_floor
        if start == end:
            continue
        chain = hashes[start:end]
        accessed = list(map(last.get, chain, repeat(0)))
        _request(
            ramp,
            sparse,
            fenwick,
            accessed,
            _runs(accessed, floor),
            floor,
            clock,
            lengths[request],
            size,
        )
        fenwick.add(clock + 1, clock + len(chain), 1)
        # Deepest first: the request's last block gets the earliest time, its first block the latest.
        last.update(zip(chain, range(clock + len(chain), clock, -1), strict=True))
        clock += len(chain)
    final_live = fenwick.prefix(clock) - fenwick.prefix(floor - 1)
    functions = curves.functions()
    return LruCurve(
        block_size=size,
        ttl_s=ttl_s,
        max_blocks=max_blocks,
        hit_blocks=functions["blocks"],
        hit_tokens=functions["tokens"],
        hit_requests=functions["requests"],
        inserted_blocks=functions["inserted"],
        expired_blocks=functions["expired"],
        device_blocks=functions["device_blocks"],
        device_tokens=functions["device_tokens"],
        sparse=tuple(sparse),
        final_live_blocks=final_live,
    )


def _runs(accessed: list[int], floor: int) -> list[int]:
    """Where the runs of a request's blocks start, then its length: a run is blocks with consecutive access times
    (deepest last: t, t - 1, ...), or blocks that are dead (never seen or expired: below `floor`) together.

    In a trace of hash chains a parent is always accessed after its child, so the access times never grow along a
    request; then each run's end is found by bisection (a run is where accessed[i] == t - (i - a)), in C-speed scans
    and O(log n) Python steps per run. Other traces take a plain scan.
    """
    length = len(accessed)
    if all(map(ge, accessed, accessed[1:])):
        bounds = []
        live = bisect_left(range(length), True, key=lambda index: accessed[index] < floor)
        first = 0
        while first < live:
            bounds.append(first)
            top = accessed[first] + first
            first = bisect_left(range(first, live), True, key=lambda index: accessed[index] != top - index) + first
        if live < length:
            bounds.append(live)
        bounds.append(length)
        return bounds
    breaks = [
        index
        for index, (previous, current) in enumerate(zip(accessed, accessed[1:], strict=False), 1)
        if current != previous - 1 and (current >= floor or previous >= floor)
    ]
    return [0, *breaks, length]


def _token_pieces(first: int, end: int, full_blocks: int, tail_tokens: int, size: int) -> list[tuple[int, int, int]]:
    """Positions [first, end) split by tokens per hit block: `size` below `full_blocks`, `tail_tokens` at it (the
    partial block the input length cuts), 0 past it. (piece_first, piece_end, tokens) triples, empty pieces left out."""
    pieces = []
    cut = min(max(full_blocks, first), end)
    if cut > first:
        pieces.append((first, cut, size))
    if cut < end and cut == full_blocks:
        pieces.append((cut, cut + 1, tail_tokens))
        cut += 1
    if cut < end:
        pieces.append((cut, end, 0))
    return pieces


def _request(
    ramp: Callable[[str, int, int, int], None],
    sparse: list[_Sparse],
    fenwick: _RangeFenwick,
    accessed: list[int],
    bounds: list[int],
    floor: int,
    clock: int,
    input_length: int,
    size: int,
) -> None:
    """Add one request's blocks to the curves and retire their previous accesses from `fenwick`.

    `accessed[i]` is block i's previous access time (0: never); `bounds` cut the positions into runs. A live run
    starting at position a with access time t has distances d_a = 1 + (live accesses after t), d_{a+j} = d_a + j.
    """
    full_blocks, tail_tokens = divmod(input_length, size)
    top = fenwick.prefix(clock)
    retired: list[tuple[int, int]] = []  # every distance is taken against the stack the request found: retire after
    prefix_max = 0  # the largest distance so far among the leading blocks; -1 once one of them was never cached
    for run_first, run_end in zip(bounds, bounds[1:], strict=False):
        time = accessed[run_first]
        live = 0 if time < floor else min(run_end - run_first, time - floor + 1)
        if live:
            distance = 1 + top - fenwick.prefix(time)
            offset = distance - run_first  # d_i = offset + i over the live part of the run
            retired.append((time - live + 1, time))
            live_end = run_first + live
            if offset >= 2:
                # Inserted at C when i < C < d_i: +1 at C = i + 1, -1 at C = d_i.
                ramp("inserted", run_first + 1, live_end + 1, 1)
                ramp("inserted", run_first + offset, live_end + offset, -1)
            if prefix_max >= 0:
                if run_first == 0:
                    ramp("requests", distance, distance + 1, 1)
                # Blocks whose distance is below the prefix maximum hit with it; the rest set a new maximum.
                below_end = min(live_end, max(prefix_max - offset + 1, run_first))
                for first, end, tokens in _token_pieces(run_first, below_end, full_blocks, tail_tokens, size):
                    ramp("blocks", prefix_max, prefix_max + 1, end - first)
                    ramp("tokens", prefix_max, prefix_max + 1, (end - first) * tokens)
                    sparse.append(_Sparse(offset + first, end - first, prefix_max, tokens))
                for first, end, tokens in _token_pieces(below_end, live_end, full_blocks, tail_tokens, size):
                    ramp("blocks", offset + first, offset + end, 1)
                    ramp("device_blocks", offset + first, offset + end, 1)
                    if tokens:
                        ramp("tokens", offset + first, offset + end, tokens)
                        ramp("device_tokens", offset + first, offset + end, tokens)
                if live_end > below_end:
                    prefix_max = offset + live_end - 1
        else:
            live_end = run_first
        if live_end < run_end:
            # Never seen or expired: inserted at every C > i; no later block of the request can hit.
            ramp("inserted", live_end + 1, run_end + 1, 1)
            prefix_max = -1
    for first_time, last_time in retired:
        fenwick.add(first_time, last_time, -1)
