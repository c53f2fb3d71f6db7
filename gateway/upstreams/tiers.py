"""Reading the local engine's per-tier match report: where the matched prompt tokens' KV was found and how long
loading it back to the device took.

The engine reports `prefix_cache.tiers = {"device": n, "host": n, "disk": n}` and `prefix_cache.load_ms` in the body
(and on the streamed usage chunk), and `x-prefix-cache-tiers: device=N,host=N,disk=N` on every response. Whatever an
upstream sends here is untrusted: anything malformed (a missing tier, a negative, fractional or boolean count, a count
no database column could hold, a non-finite time) reads as "not reported" (None), never as an error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from db.records import CACHE_TIERS

HEADER_TIERS = "x-prefix-cache-tiers"
# The largest count stored: the columns are 32-bit INTEGERs on PostgreSQL, and a larger value would fail the insert.
MAX_TIER_TOKENS = 2**31 - 1
MAX_HEADER_CHARS = 200


@dataclass(frozen=True, slots=True)
class TierSplit:
    """Matched prompt tokens by the tier that held their KV (tokens)."""

    device_tokens: int
    host_tokens: int
    disk_tokens: int


def first_tokens(split: TierSplit, num_tokens: int) -> TierSplit:
    """The split of the first `num_tokens` matched tokens: a match runs device, then host, then disk along its path
    (a tier never holds a node above one in a faster tier), so the first tokens are taken in that order."""
    device = min(split.device_tokens, max(0, num_tokens))
    host = min(split.host_tokens, max(0, num_tokens) - device)
    disk = min(split.disk_tokens, max(0, num_tokens) - device - host)
    return TierSplit(device, host, disk)


def _count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or not 0 <= value <= MAX_TIER_TOKENS:
        return None
    return value


def _split(counts: Mapping[str, Any]) -> TierSplit | None:
    values = [_count(counts.get(tier)) for tier in CACHE_TIERS]
    if any(value is None for value in values):
        return None
    device, host, disk = values
    assert device is not None and host is not None and disk is not None
    return TierSplit(device, host, disk)


def tiers_from_prefix_cache(prefix_cache: Any) -> TierSplit | None:
    """The split in a `prefix_cache` object (`tiers`), or None when absent or malformed."""
    if not isinstance(prefix_cache, dict):
        return None
    tiers = prefix_cache.get("tiers")
    return _split(tiers) if isinstance(tiers, dict) else None


def load_ms_from_prefix_cache(prefix_cache: Any) -> float | None:
    """`prefix_cache.load_ms` (milliseconds, finite and >= 0), or None when absent or malformed."""
    if not isinstance(prefix_cache, dict):
        return None
    value = prefix_cache.get("load_ms")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


def tiers_from_header(value: str | None) -> TierSplit | None:
    """The split in an `x-prefix-cache-tiers` header value (`device=N,host=N,disk=N`; unknown tiers are ignored), or
    None when absent or malformed (a tier missing or given twice, a count that is not a non-negative integer)."""
    if value is None or len(value) > MAX_HEADER_CHARS:
        return None
    counts: dict[str, int] = {}
    for item in value.split(","):
        name, sep, number = item.partition("=")
        name, number = name.strip(), number.strip()
        if not sep or name in counts or not number.isascii() or not number.isdigit():
            return None
        counts[name] = int(number)
    return _split(counts)
