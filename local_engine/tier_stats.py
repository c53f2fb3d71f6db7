"""The per-tier section of the cache statistics (`/v1/cache` `tiers`, and the `tier` label of `/metrics`).

The engine reports `cache_stats()["tiers"]` as `{"device": {...}, "host": {...}, "disk": {...}}`. An engine that
does not (a cache without lower tiers) still gets the full shape here: the device tier from the pool's figures, the
host and disk tiers disabled with zeros, so clients and dashboards read one shape everywhere.

Each tier's dict: `enabled`, `capacity_tokens`, `cached_tokens`, `free_tokens`, `evictable_tokens`,
`protected_tokens`, `capacity_bytes` (gauges) and `hit_tokens_total`, `loads_total`, `load_tokens_total`,
`load_ms_total`, `demoted_tokens_total`, `dropped_tokens_total`, `corrupt_files_total` (monotonic counters).
"""

from __future__ import annotations

from local_engine.cache.tiers import TIERS

TIER_GAUGES = ("capacity_tokens", "cached_tokens", "free_tokens", "evictable_tokens", "protected_tokens",
               "capacity_bytes")
TIER_COUNTERS = ("hit_tokens_total", "loads_total", "load_tokens_total", "load_ms_total", "demoted_tokens_total",
                 "dropped_tokens_total", "corrupt_files_total")


def _empty_tier() -> dict:
    return {"enabled": False, **dict.fromkeys(TIER_GAUGES, 0), **dict.fromkeys(TIER_COUNTERS, 0)}


def _device_tier(stats: dict) -> dict:
    """The device tier as the single-tier statistics describe it."""
    tier = _empty_tier()
    tier.update(
        enabled=True,
        capacity_tokens=stats.get("capacity_tokens", 0),
        cached_tokens=stats.get("cached_tokens", 0),
        free_tokens=stats.get("free_tokens", 0),
        evictable_tokens=stats.get("evictable_tokens", 0),
        protected_tokens=stats.get("protected_tokens", 0),
        capacity_bytes=stats.get("pool_bytes", 0),
        hit_tokens_total=stats.get("cached_tokens_total", 0),
        # Without a lower tier, what leaves the device is gone for good.
        dropped_tokens_total=stats.get("evicted_tokens_total", 0) + stats.get("expired_tokens_total", 0),
    )
    return tier


def tier_stats(stats: dict) -> dict[str, dict]:
    """`stats["tiers"]` (from `Engine.cache_stats()`) with every tier and field present; missing ones are zero."""
    reported = stats.get("tiers")
    if not isinstance(reported, dict):
        return {tier.value: _device_tier(stats) if tier.value == "device" else _empty_tier() for tier in TIERS}
    tiers = {}
    for tier in TIERS:
        tiers[tier.value] = {**_empty_tier(), **reported.get(tier.value, {})}
    return tiers
