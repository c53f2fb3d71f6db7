"""The fixed log-spaced TTFT histogram kept in the rollups, and quantiles estimated from it.

Eight bins per decade from 0.1 ms to 100 s: a bin spans a factor of 10**(1/8) (about 1.33), so a quantile read
from the bins, interpolated geometrically inside its bin, is within about 15% of the exact value. The edges are
part of the stored data: changing them needs a migration that rebuilds `hourly_ttft_bins`.

Each stored bin also keeps the smallest and largest TTFT that fell into it. A quantile is interpolated between those,
not between the bin's edges: the estimate never exceeds the largest value seen (two samples of 99.8 and 105.9 ms
give a p95 within [99.8, 105.9], not 130 ms), and `quantile_range` states the bound that holds for sure. (A DDSketch
would bound the relative error too, but needs a stored sketch per hour and group; the fixed bins plus an observed
min/max per bin keep the rollups additive with plain upserts and give a tighter, observed bound.)
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping
from typing import Final

BINS_PER_DECADE: Final = 8
# EDGES_MS[i] is the upper bound of bin i (exclusive); bin len(EDGES_MS) collects everything from 100 s up.
EDGES_MS: Final[tuple[float, ...]] = tuple(10 ** (k / BINS_PER_DECADE) for k in range(-8, 41))
NUM_BINS: Final = len(EDGES_MS) + 1


def bin_of(ttft_ms: float) -> int:
    """The bin index of a TTFT in milliseconds (negative values land in bin 0)."""
    return bisect_right(EDGES_MS, ttft_ms)


def bin_bounds(index: int) -> tuple[float, float | None]:
    """`(lower_ms, upper_ms)` of a bin; the last bin has no upper bound."""
    lower = 0.0 if index == 0 else EDGES_MS[index - 1]
    upper = EDGES_MS[index] if index < len(EDGES_MS) else None
    return lower, upper


def merge(counts: Iterable[Mapping[int, int]]) -> dict[int, int]:
    """Bin-wise sum of several histograms."""
    total: dict[int, int] = {}
    for histogram in counts:
        for index, count in histogram.items():
            total[index] = total.get(index, 0) + count
    return total


Range = tuple[float | None, float | None]


def _bin_holding(counts: Mapping[int, int], q: float) -> tuple[int, float] | None:
    """The bin holding the `q`-quantile and the fraction of its samples ranked below it."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {q}")
    total = sum(count for count in counts.values() if count > 0)
    if total == 0:
        return None
    rank = q * total
    cumulative = 0
    for index in sorted(counts):
        count = counts[index]
        if count <= 0:
            continue
        if cumulative + count >= rank:
            return index, (rank - cumulative) / count
        cumulative += count
    return max(counts), 1.0  # unreachable with non-negative counts; kept so the function is total


def quantile_range(
    counts: Mapping[int, int], q: float, ranges: Mapping[int, Range] | None = None
) -> tuple[float, float | None] | None:
    """Where the exact `q`-quantile lies for sure: the smallest and largest TTFT observed in the bin that holds it
    (the bin's edges when they were not kept). None for an empty histogram."""
    held = _bin_holding(counts, q)
    if held is None:
        return None
    index = held[0]
    lower, upper = bin_bounds(index)
    low, high = (ranges or {}).get(index, (None, None))
    return (lower if low is None else low, upper if high is None else high)


def quantile(counts: Mapping[int, int], q: float, ranges: Mapping[int, Range] | None = None) -> float | None:
    """Estimate the `q`-quantile (0..1) in milliseconds from bin counts; None for an empty histogram.

    Interpolated geometrically inside the bin that holds it, between the smallest and largest TTFT observed in that
    bin when `ranges` has them (so the estimate never leaves what was seen), else between the bin's edges.
    """
    held = _bin_holding(counts, q)
    if held is None:
        return None
    index, fraction = held
    lower, upper = quantile_range(counts, q, ranges) or (0.0, None)
    if upper is None:
        return lower
    if lower <= 0.0:
        return lower + (upper - lower) * fraction
    # Geometric interpolation: bins are log-spaced, so this spreads samples evenly in log space.
    return float(lower * (upper / lower) ** fraction)
