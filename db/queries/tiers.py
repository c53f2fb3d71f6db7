"""Cached tokens by tier, cache load time and retention classes over a range, folded from history rows.

The per-bucket figures are part of every `CacheFigures` (`stats` rows, `overview`, `totals_by`), read from the hourly
rollups (minute buckets from the request rows, with the same arithmetic). `tier_totals` adds up a set of such rows
into one `TierTotals`, which is what the stats API and the CLI print beside a series: every figure in it is a sum, so
the fold is exact (the mean load time is the summed time over the summed count, not a mean of means).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from db.queries.results import CacheFigures, CachedByTier
from db.queries.totals import by_retention_class


@dataclass(frozen=True)
class TierTotals:
    """Cached tokens by tier over some requests, and what they cost to load and asked to be kept.

    `tiers` adds up to `cached_tokens` (`CachedByTier.unknown` holds what no tier was reported for);
    `cache_load_ms_mean` is per request that reported a load time (None without any); `requests_by_retention` counts
    requests per retention class, `requests_without_retention` the rest.
    """

    requests: int = 0
    cached_tokens: int = 0
    tiers: CachedByTier = field(default_factory=CachedByTier)
    requests_with_known_tiers: int = 0
    cache_load_ms_total: float = 0.0
    cache_load_ms_mean: float | None = None
    requests_with_known_load: int = 0
    requests_by_retention: dict[str, int] = field(default_factory=dict)
    requests_without_retention: int = 0


def tier_totals(rows: Iterable[CacheFigures]) -> TierTotals:
    """The sum of `rows` (e.g. every bucket and group of one `stats` call: disjoint sets of requests)."""
    requests = cached = known_tiers = loads = 0
    load_ms = 0.0
    tiers = CachedByTier()
    retention: dict[str, int] = {}
    for row in rows:
        requests += row.requests
        cached += row.cached_tokens
        tiers += row.tiers
        known_tiers += row.requests_with_known_tiers
        load_ms += row.cache_load_ms_total
        loads += row.requests_with_known_load
        for name, count in row.requests_by_retention.items():
            retention[name] = retention.get(name, 0) + count
    ranked = by_retention_class(retention)
    return TierTotals(
        requests=requests,
        cached_tokens=cached,
        tiers=tiers,
        requests_with_known_tiers=known_tiers,
        cache_load_ms_total=load_ms,
        cache_load_ms_mean=load_ms / loads if loads else None,
        requests_with_known_load=loads,
        requests_by_retention=ranked,
        requests_without_retention=requests - sum(ranked.values()),
    )
