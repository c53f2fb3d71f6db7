"""The What-if page's replay: token hit rate over a grid of cache sizes x eviction policies x TTLs, from a sample of
recorded chains, with the page's choices and defaults. Pure functions over `db.simulation`; no Streamlit, no database.

A cache that can hold every distinct block of the trace never evicts, so at or above that size every policy gives the
unlimited cache's figures: those grid points are copied from one unlimited replay per TTL instead of being replayed,
which keeps the default grid (up to 10M tokens) cheap on a small sample. LRU's points come from one pass over the
trace per TTL (stack distances, `db.simulation.lru_curve`), however many sizes are asked for.

`run_tiers` models a device tier with a host tier below it (LRU with demotion) and returns the whole curve over the
device size, from the same single pass, with the split of the hits between the tiers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from db.simulation import (
    POLICIES,
    SimulationResult,
    Trace,
    TraceRequest,
    curve_result,
    lru_curve,
    simulate,
    sweep,
)

CAPACITY_CHOICES = (
    1_000,
    3_000,
    10_000,
    30_000,
    100_000,
    300_000,
    1_000_000,
    3_000_000,
    10_000_000,
    30_000_000,
    100_000_000,
)
DEFAULT_CAPACITIES = (10_000, 30_000, 100_000, 300_000, 1_000_000, 3_000_000, 10_000_000)
TTL_CHOICES: tuple[float | None, ...] = (None, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0)
DEFAULT_TTLS: tuple[float | None, ...] = (None, 300.0, 3600.0)
DEFAULT_POLICIES = POLICIES
# Most blocks replayed: the replay is pure Python (a tenth to a whole second per setting for 200k blocks, `optimal`
# with a TTL the slowest), so the default keeps the default grid under a second; the page offers more, slower.
BLOCK_BUDGETS = (10_000, 25_000, 50_000, 100_000, 200_000, 500_000, 1_000_000)
DEFAULT_BLOCK_BUDGET = 50_000
# Today's capacity the page assumes until told otherwise, when the engine cannot say: the local engine's default pool
# (`local_engine.config.DEFAULT_KV_CACHE_TOKENS`, repeated here because the dashboard never imports the engine).
FALLBACK_CAPACITY_TOKENS = 65_536
# Page sizes offered: these multiples of the recorded block size (chains merge into larger pages, never split).
PAGE_FACTORS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class CurrentSetting:
    """Today's cache as the page marks it: capacity in tokens, eviction policy, TTL (None: none)."""

    capacity_tokens: int
    policy: str
    ttl_s: float | None


@dataclass(frozen=True)
class WhatIfResult:
    """The grid's replays (policy, then TTL, then capacity order), the unlimited cache per TTL, and today's setting."""

    results: tuple[SimulationResult, ...]
    unlimited: tuple[SimulationResult, ...]
    today: SimulationResult | None
    page_size: int
    num_requests: int
    num_blocks: int
    distinct_blocks: int
    prompt_tokens: int

    def series(self) -> dict[tuple[str, float | None], list[SimulationResult]]:
        """One list per (policy, TTL), by capacity: the page's lines."""
        lines: dict[tuple[str, float | None], list[SimulationResult]] = {}
        for result in self.results:
            lines.setdefault((result.policy, result.ttl_s), []).append(result)
        return lines

    @property
    def ceiling(self) -> SimulationResult | None:
        """Unlimited cache without TTL: every block seen before hits (the best any cache could do on this trace)."""
        return next((result for result in self.unlimited if result.ttl_s is None), None)


def page_size_choices(block_sizes: Sequence[int]) -> list[int]:
    """Page sizes a trace with these recorded block sizes can be replayed at (multiples of all of them)."""
    base = math.lcm(*block_sizes) if block_sizes else 1
    return [base * factor for factor in PAGE_FACTORS]


def default_page_size(choices: Sequence[int], engine_page_size: int | None) -> int:
    """The engine's page size when the chains can be replayed at it, else the recorded block size."""
    return engine_page_size if engine_page_size is not None and engine_page_size in choices else choices[0]


def run_what_if(
    requests: Sequence[TraceRequest],
    page_size: int,
    capacities: Sequence[int],
    policies: Sequence[str],
    ttls: Sequence[float | None],
    today: CurrentSetting | None = None,
) -> WhatIfResult:
    """Replay `requests` at `page_size` for every capacity x policy x TTL, plus unlimited per TTL and `today`.

    Raises `db.simulation.TraceError` for a page size the chains cannot be merged into and ValueError for an unknown
    policy.
    """
    trace = Trace.from_requests(requests, page_size=page_size)
    distinct_blocks = len(set(trace.hashes))
    unlimited = {ttl: simulate(trace, None, "lru", ttl) for ttl in dict.fromkeys(ttls)}
    ordered_capacities = sorted(set(capacities))
    # Below the trace's distinct blocks the size matters; at or above it nothing is ever evicted.
    small = [capacity for capacity in ordered_capacities if capacity // trace.block_size < distinct_blocks]
    replayed = {
        (result.policy, result.ttl_s, result.capacity_tokens): result
        for result in (sweep(trace, small, policies, list(unlimited)) if small and policies else [])
    }

    def at(capacity: int, policy: str, ttl: float | None) -> SimulationResult:
        found = replayed.get((policy, ttl, capacity))
        if found is not None:
            return found
        if capacity // trace.block_size >= distinct_blocks and ttl in unlimited:
            return replace(unlimited[ttl], policy=policy, capacity_tokens=capacity)
        return simulate(trace, capacity, policy, ttl)

    results = [at(capacity, policy, ttl) for policy in policies for ttl in unlimited for capacity in ordered_capacities]
    today_result = None if today is None else at(today.capacity_tokens, today.policy, today.ttl_s)
    return WhatIfResult(
        results=tuple(results),
        unlimited=tuple(unlimited.values()),
        today=today_result,
        page_size=trace.block_size,
        num_requests=trace.num_requests,
        num_blocks=trace.num_blocks,
        distinct_blocks=distinct_blocks,
        prompt_tokens=trace.prompt_tokens,
    )


# Host tier (L2) sizes offered: none, or one of the cache sizes.
HOST_CAPACITY_CHOICES = (0, *CAPACITY_CHOICES)
# Points of the drawn LRU curve: log-spaced device sizes, plus the chosen ones.
CURVE_POINTS = 160


@dataclass(frozen=True)
class TiersResult:
    """LRU with a device tier and a host tier below it (demotion on eviction), from one pass over the trace.

    `curve_*` hold the whole curve, by device capacity in tokens (ascending): token hit rates of the device tier and
    of both tiers together when the host holds `host_capacity_tokens` (0: no host tier; then the two are equal).
    `points` are the chosen device sizes with that host tier; `today` today's device size with it.
    """

    host_capacity_tokens: int
    ttl_s: float | None
    page_size: int
    curve_capacity_tokens: tuple[int, ...]
    curve_device_rates: tuple[float | None, ...]
    curve_total_rates: tuple[float | None, ...]
    points: tuple[SimulationResult, ...]
    today: SimulationResult | None
    distinct_blocks: int


def curve_capacities_blocks(max_blocks: int, chosen_blocks: Sequence[int], num_points: int = CURVE_POINTS) -> list[int]:
    """Device sizes in blocks to draw the curve at: about `num_points` log-spaced from 1 to one past `max_blocks`
    (where the curve is flat), and every chosen size."""
    top = max_blocks + 1
    spaced = {round(top ** (step / (num_points - 1))) for step in range(num_points)} if top > 1 else {1}
    return sorted(spaced | {blocks for blocks in chosen_blocks if blocks >= 1})


def run_tiers(
    requests: Sequence[TraceRequest],
    page_size: int,
    capacities: Sequence[int],
    host_capacity_tokens: int,
    ttl_s: float | None,
    today_capacity_tokens: int | None = None,
) -> TiersResult:
    """The LRU curve over every device size with a host tier of `host_capacity_tokens` below it, at `ttl_s`, and the
    split between the tiers at each of `capacities` (and today's device size), all from one pass over the trace.

    Raises `db.simulation.TraceError` for a page size the chains cannot be merged into, ValueError for a negative
    size or TTL.
    """
    trace = Trace.from_requests(requests, page_size=page_size)
    curve = lru_curve(trace, ttl_s)
    size = trace.block_size
    host_blocks = host_capacity_tokens // size
    chosen = sorted(set(capacities))
    drawn = curve_capacities_blocks(curve.max_blocks, [capacity // size for capacity in chosen])
    prompt_tokens = trace.prompt_tokens

    def rate(tokens: int) -> float | None:
        return tokens / prompt_tokens if prompt_tokens else None

    split = [curve.counts(blocks, host_blocks) for blocks in drawn]
    points = [curve_result(trace, curve, capacity, host_capacity_tokens) for capacity in chosen]
    today = (
        None
        if today_capacity_tokens is None
        else curve_result(trace, curve, today_capacity_tokens, host_capacity_tokens)
    )
    return TiersResult(
        host_capacity_tokens=host_capacity_tokens,
        ttl_s=ttl_s,
        page_size=size,
        curve_capacity_tokens=tuple(blocks * size for blocks in drawn),
        curve_device_rates=tuple(rate(counts.device_hit_tokens) for counts in split),
        curve_total_rates=tuple(rate(counts.hit_tokens) for counts in split),
        points=tuple(points),
        today=today,
        distinct_blocks=curve.max_blocks,
    )
