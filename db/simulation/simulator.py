"""What-if replay of a trace through a prefix cache of a given size, eviction policy and TTL.

The cache model (the one vLLM's block hashes and Mooncake's `hash_ids` traces imply; `db.cache_model` implements it
for `lru` and `fifo`, and the demo and the advisor ask it too):

- The cache is a flat set of blocks keyed by chained hash. Since hash i already stands for the whole prefix through
  block i, a flat set is a prefix cache: a request's hit is its number of *leading* blocks found in the cache, and the
  lookup stops at the first block that is not cached (a deeper block cached without its parent is useless).
- Capacity is in tokens; the cache holds `capacity_tokens // block_size` blocks (`None`: unlimited).
- Requests are replayed in time order. Each request first drops every block idle for more than the TTL (`now - last
  touch > ttl_s`; a block touched exactly `ttl_s` ago still hits), then looks up, then is admitted: its blocks are
  inserted or touched, all of them, as an engine caches the whole prompt after prefill.
- A request's own blocks are never evicted to make room for it. A request longer than the whole cache keeps only its
  first `capacity` blocks (a deeper block of it that was cached is dropped, counted as evicted).
- Within one request the deepest block counts as the oldest (touched and inserted first), so a request's chain is
  evicted leaf first, as a radix tree frees leaves before their parents. Under `lru` (and `optimal`) a parent is
  therefore never evicted before its child; `fifo` can orphan a child, which then counts as nothing.
- Policies: `lru` evicts the least recently touched block; `fifo` the earliest inserted (a hit does not refresh it);
  `optimal` is Belady's: the block whose next use lies furthest in the future, read from the trace itself, where a
  block the TTL will drop before its next use counts as never used again. It is the best any policy could do in this
  model, the ceiling for the other two.

Figures: `hit_tokens` sums, per request, `min(hit_blocks * block_size, input_length)`; the token hit rate divides it by
the sum of input lengths (all prompt tokens, so a trailing partial block counts as a miss: it is the real share of
prompt tokens served from cache). The block hit rate is hit blocks over all blocks, and the request hit share the
fraction of requests with at least one hit block. An engine that must compute the last prompt token serves at most
`input_length - 1` tokens, so a fully cached prompt whose length is a multiple of the block size hits one block less
there than here.

Two levels (`host_capacity_tokens`, LRU only): the device (L1) holds `capacity_tokens`, the host (L2)
`host_capacity_tokens`; a block evicted from the device is demoted to the host, a host hit moves the block back to the
device, and a block evicted from the host is gone. Together they behave as one LRU cache of both sizes (hits, evictions
and expiries are that cache's); each hit block is counted on the tier that held it (`device_*` and `host_*`). A TTL
counts idle time across both tiers.

LRU has one figure per capacity from a single pass over the trace (`db.simulation.stack`, stack distances), so `sweep`
computes its LRU points from one pass per TTL; `fifo` and `optimal` have no such inclusion property and replay each
point. `simulate` replays a single-level LRU point directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

from db.simulation.policies import NextUse, ReplayCounts, next_uses, replay_fifo, replay_lru, replay_optimal
from db.simulation.stack import LruCurve, TierCounts, lru_curve
from db.simulation.trace import Trace

POLICIES: Final = ("lru", "fifo", "optimal")


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """The outcome of replaying one trace with one setting (capacity, policy, TTL)."""

    policy: str
    capacity_tokens: int | None  # None: unlimited
    ttl_s: float | None  # None: blocks never expire
    block_size: int
    num_requests: int
    num_blocks: int
    prompt_tokens: int
    hit_tokens: int
    hit_blocks: int
    hit_requests: int
    evicted_blocks: int
    expired_blocks: int
    # The split of the hits between the tiers; a single-level cache (host capacity 0) hits on the device only.
    host_capacity_tokens: int | None = 0  # None: unlimited
    device_hit_tokens: int = 0
    device_hit_blocks: int = 0
    host_hit_tokens: int = 0
    host_hit_blocks: int = 0

    @property
    def capacity_blocks(self) -> int | None:
        return None if self.capacity_tokens is None else self.capacity_tokens // self.block_size

    @property
    def host_capacity_blocks(self) -> int | None:
        return None if self.host_capacity_tokens is None else self.host_capacity_tokens // self.block_size

    @property
    def device_token_hit_rate(self) -> float | None:
        """Tokens served from the device tier over all prompt tokens; None for a trace without prompt tokens."""
        return self.device_hit_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def host_token_hit_rate(self) -> float | None:
        """Tokens served from the host tier over all prompt tokens; None for a trace without prompt tokens."""
        return self.host_hit_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def token_hit_rate(self) -> float | None:
        """Hit tokens over all prompt tokens; None for a trace without prompt tokens."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def block_hit_rate(self) -> float | None:
        """Hit blocks over all blocks; None for a trace without blocks."""
        return self.hit_blocks / self.num_blocks if self.num_blocks else None

    @property
    def request_hit_share(self) -> float | None:
        """The share of requests with at least one hit block; None for an empty trace."""
        return self.hit_requests / self.num_requests if self.num_requests else None

    def to_dict(self) -> dict[str, Any]:
        """The fields plus the capacity in blocks and the three rates, JSON-ready."""
        data = asdict(self)
        data["capacity_blocks"] = self.capacity_blocks
        data["host_capacity_blocks"] = self.host_capacity_blocks
        data["token_hit_rate"] = self.token_hit_rate
        data["block_hit_rate"] = self.block_hit_rate
        data["request_hit_share"] = self.request_hit_share
        data["device_token_hit_rate"] = self.device_token_hit_rate
        data["host_token_hit_rate"] = self.host_token_hit_rate
        return data


def simulate(
    trace: Trace,
    capacity_tokens: int | None,
    policy: str,
    ttl_s: float | None = None,
    host_capacity_tokens: int | None = 0,
) -> SimulationResult:
    """Replay `trace` through a cache of `capacity_tokens` (None: unlimited) with `policy` and `ttl_s` (None: none),
    and a host tier of `host_capacity_tokens` below it (0: none; None: unlimited; LRU only).

    Raises ValueError for an unknown policy, a negative capacity or TTL, or a host tier with another policy than LRU.
    """
    _check(capacity_tokens, policy, ttl_s, host_capacity_tokens)
    if host_capacity_tokens != 0:
        return curve_result(trace, lru_curve(trace, ttl_s), capacity_tokens, host_capacity_tokens)
    return _replay(trace, capacity_tokens, policy, ttl_s, None)


def sweep(
    trace: Trace,
    capacities: Sequence[int | None],
    policies: Sequence[str] = POLICIES,
    ttls: Sequence[float | None] = (None,),
    on_result: Callable[[SimulationResult], None] | None = None,
    host_capacities: Sequence[int | None] = (0,),
) -> list[SimulationResult]:
    """Every combination, capacity first, then host capacity, then policy, then TTL.

    LRU points come from one pass over the trace per TTL (`lru_curve`), whatever the number of capacities; `fifo`
    and `optimal` replay each point (their next-use scan runs once). `on_result` is called after each combination
    (for progress reporting). Raises ValueError as `simulate` does.
    """
    for capacity in capacities:
        for host_capacity in host_capacities:
            for policy in policies:
                for ttl in ttls:
                    _check(capacity, policy, ttl, host_capacity)
    next_use = next_uses(trace) if "optimal" in policies else None
    curves: dict[float | None, LruCurve] = {}
    results = []
    for capacity in capacities:
        for host_capacity in host_capacities:
            for policy in policies:
                for ttl in ttls:
                    if policy == "lru":
                        curve = curves.get(ttl)
                        if curve is None:
                            curve = curves[ttl] = lru_curve(trace, ttl)
                        results.append(curve_result(trace, curve, capacity, host_capacity))
                    else:
                        results.append(_replay(trace, capacity, policy, ttl, next_use))
                    if on_result is not None:
                        on_result(results[-1])
    return results


def _check(capacity_tokens: int | None, policy: str, ttl_s: float | None, host_capacity_tokens: int | None) -> None:
    if policy not in POLICIES:
        raise ValueError(f"unknown eviction policy {policy!r}; choose from {', '.join(POLICIES)}")
    if capacity_tokens is not None and capacity_tokens < 0:
        raise ValueError(f"a cache capacity cannot be negative, got {capacity_tokens} tokens")
    if host_capacity_tokens is not None and host_capacity_tokens < 0:
        raise ValueError(f"a host cache capacity cannot be negative, got {host_capacity_tokens} tokens")
    if host_capacity_tokens != 0 and policy != "lru":
        raise ValueError(
            f"a host tier is modelled for lru only (an LRU hierarchy with demotion); {policy} replays a single level"
        )
    if ttl_s is not None and ttl_s < 0:
        raise ValueError(f"a TTL cannot be negative, got {ttl_s}s")


def _result(
    trace: Trace,
    policy: str,
    capacity_tokens: int | None,
    host_capacity_tokens: int | None,
    ttl_s: float | None,
    counts: TierCounts,
) -> SimulationResult:
    return SimulationResult(
        policy=policy,
        capacity_tokens=capacity_tokens,
        ttl_s=ttl_s,
        block_size=trace.block_size,
        num_requests=trace.num_requests,
        num_blocks=trace.num_blocks,
        prompt_tokens=trace.prompt_tokens,
        host_capacity_tokens=host_capacity_tokens,
        **counts._asdict(),
    )


def curve_result(
    trace: Trace, curve: LruCurve, capacity_tokens: int | None, host_capacity_tokens: int | None = 0
) -> SimulationResult:
    """The LRU result at one setting read off `curve` (`lru_curve(trace, ttl_s)`): what `simulate` gives for it."""
    _check(capacity_tokens, "lru", curve.ttl_s, host_capacity_tokens)
    size = trace.block_size
    device = None if capacity_tokens is None else capacity_tokens // size
    host = None if host_capacity_tokens is None else host_capacity_tokens // size
    counts = curve.counts(device, host)
    return _result(trace, "lru", capacity_tokens, host_capacity_tokens, curve.ttl_s, counts)


def _replay(
    trace: Trace, capacity_tokens: int | None, policy: str, ttl_s: float | None, next_use: NextUse | None
) -> SimulationResult:
    # Unlimited: room for every block of the trace, so nothing is ever evicted.
    capacity = trace.num_blocks if capacity_tokens is None else capacity_tokens // trace.block_size
    counts: ReplayCounts
    if policy == "lru":
        counts = replay_lru(trace, capacity, ttl_s)
    elif policy == "fifo":
        counts = replay_fifo(trace, capacity, ttl_s)
    else:
        counts = replay_optimal(trace, capacity, ttl_s, next_use or next_uses(trace))
    # One level: every hit is a device hit.
    split = TierCounts(*counts, counts.hit_tokens, counts.hit_blocks, 0, 0)
    return _result(trace, policy, capacity_tokens, 0, ttl_s, split)
