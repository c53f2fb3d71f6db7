"""The local engine's ledger headers, read into `CacheReport` fields: `x-prefix-cache-page-size`,
`x-prefix-cache-seen-tokens`, `x-prefix-cache-seen-segment` / `-seen-offset`, `x-prefix-cache-segments` (`system=3,messages[1]=40`) and `x-prefix-cache-dropped`
(`kind=expired,tier=host,retention=5m,idle_s=301.2`). Malformed values read as absent."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

HEADER_PAGE_SIZE = "x-prefix-cache-page-size"
HEADER_SEEN_TOKENS = "x-prefix-cache-seen-tokens"
HEADER_SEGMENTS = "x-prefix-cache-segments"
HEADER_DROPPED = "x-prefix-cache-dropped"
HEADER_SEEN_SEGMENT = "x-prefix-cache-seen-segment"
HEADER_SEEN_OFFSET = "x-prefix-cache-seen-offset"
LEDGER_HEADERS = (HEADER_PAGE_SIZE, HEADER_SEEN_TOKENS, HEADER_SEGMENTS, HEADER_DROPPED, HEADER_SEEN_SEGMENT,
                  HEADER_SEEN_OFFSET)

_SEGMENT = re.compile(r"tools|system|prompt|messages\[\d{1,6}\]")
_SEGMENT_START = re.compile(rf"({_SEGMENT.pattern})=(\d{{1,9}})")
_TIERS = ("device", "host", "disk")
_RETENTIONS = ("5m", "1h", "persistent", "default")


def _count(value: str | None) -> int | None:
    if value is None or not value.isdigit() or len(value) > 12:
        return None
    return int(value)


def segment_starts(value: str | None) -> tuple[tuple[str, int], ...] | None:
    """`system=3,messages[1]=40` as `(("system", 3), ("messages[1]", 40))`; None when absent or malformed."""
    if not value:
        return None
    starts = []
    for item in value.split(","):
        found = _SEGMENT_START.fullmatch(item.strip())
        if found is None:
            return None
        starts.append((found.group(1), int(found.group(2))))
    return tuple(starts)


def dropped(value: str | None) -> tuple[str | None, str | None, float | None]:
    """`kind=..,tier=..,retention=..,idle_s=..` as (tier, retention class, idle seconds); unknown parts None."""
    if not value:
        return None, None, None
    fields = dict(item.split("=", 1) for item in value.split(",") if "=" in item)
    tier = fields.get("tier") if fields.get("tier") in _TIERS else None
    retention = fields.get("retention") if fields.get("retention") in _RETENTIONS else None
    try:
        idle = float(fields.get("idle_s", ""))
    except ValueError:
        idle = None
    return tier, retention, idle if idle is not None and math.isfinite(idle) and idle >= 0 else None


def ledger_fields(headers: Mapping[str, str]) -> dict[str, Any]:
    """The `CacheReport` fields the ledger headers give (each None when absent)."""
    tier, retention, idle_s = dropped(headers.get(HEADER_DROPPED))
    seen_segment = headers.get(HEADER_SEEN_SEGMENT)
    return {
        "seen_segment": seen_segment if seen_segment and _SEGMENT.fullmatch(seen_segment) else None,
        "seen_char_offset": _count(headers.get(HEADER_SEEN_OFFSET)),
        "page_size": _count(headers.get(HEADER_PAGE_SIZE)),
        "seen_tokens": _count(headers.get(HEADER_SEEN_TOKENS)),
        "segment_starts": segment_starts(headers.get(HEADER_SEGMENTS)),
        "dropped_tier": tier,
        "dropped_retention": retention,
        "dropped_idle_s": idle_s,
    }
