"""Words and table rows for requests: what a miss kind means, and the Requests table's columns."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from db.queries import RequestRow

MISS_KIND_MEANINGS = {
    "hit": "hit: the whole prompt but its last token came from the cache",
    "partial": "partial hit: the prompt matched the cache up to a point, then differed",
    "cold": "cold miss: this prefix had never been cached (or changed right at the start)",
    "evicted": "miss, evicted: this prefix had been cached but was evicted to make room",
    "expired": "miss, expired: this prefix had been cached but its time to live ran out",
}


def describe_miss_kind(miss_kind: str | None, diverged_at_token: int | None = None) -> str:
    """A sentence for the detail view."""
    if miss_kind is None:
        text = "unknown: the upstream does not report how much of the prompt was cached"
    else:
        text = MISS_KIND_MEANINGS.get(miss_kind, miss_kind)
    if diverged_at_token is not None and miss_kind in ("partial", "cold", "evicted", "expired"):
        text += f"; the prompt first differed from the cached prefix at token {diverged_at_token:,}"
    return text


def describe_divergence(
    miss_reason: str | None,
    segment: str | None,
    char_offset: int | None,
    diverged_at_token: int | None,
    recomputed_tokens: int | None,
    divergence_source: str | None,
) -> str | None:
    """A sentence for the detail view from the recorded explanation; None when the request was not explained."""
    if miss_reason is None:
        return None
    text = f"`{miss_reason}`"
    if segment is not None:
        where = f"`{segment}`" + (f" at character {char_offset:,}" if char_offset is not None else "")
        text += f"; the prompt first differed from the cached prefix in {where}"
        if diverged_at_token is not None:
            text += f" (token {diverged_at_token:,})"
        text += (
            ", as the engine located it" if divergence_source == "engine"
            else ", approximated from the nearest earlier request (the upstream does not report where its match ended)"
            if divergence_source == "history" else ""
        )
    if recomputed_tokens:
        text += f"; {recomputed_tokens:,} prompt tokens were computed again"
    return text


def describe_provider_diagnosis(upstream: str, reason: str | None, missed_tokens: int | None) -> str | None:
    """A sentence for the provider's own cache diagnosis (`requests.provider_miss_reason`); None when it gave none."""
    if reason is None:
        return None
    text = f"`{reason}` (the upstream {upstream!r}'s own diagnosis)"
    if missed_tokens is not None:
        text += f"; it estimates {missed_tokens:,} input tokens missed the cache"
    return text


_QUANTILE_NAMES = (("hit_p50", "p50 hits"), ("miss_p50", "p50 misses"), ("hit_p95", "p95 hits"),
                   ("miss_p95", "p95 misses"))


def ttft_caption(ranges_ms: Mapping[str, tuple[float, float | None]]) -> str:
    """The bound each TTFT percentile is known to lie in: the smallest and largest TTFT observed in its histogram bin,
    and where TTFT comes from."""
    bounds = []
    for key, label in _QUANTILE_NAMES:
        if key in ranges_ms:
            low, high = ranges_ms[key]
            bounds.append(f"{label} {low:,.1f}-{high:,.1f} ms" if high is not None else f"{label} ≥ {low:,.1f} ms")
    text = (
        "TTFT percentiles are interpolated in the hourly histograms and clamped to the values observed: each lies for "
        "sure within the smallest and largest TTFT seen in its bin"
    )
    text += f" ({'; '.join(bounds)})." if bounds else "."
    return text + (
        " Non-streamed requests use the engine's own queue + prefill time; streamed ones the gateway's time to the "
        "first content."
    )


def _hit_label(row: RequestRow) -> str:
    if row.cache_hit is None:
        return "error" if row.status_code >= 400 else "unknown"
    return "hit" if row.cache_hit else "miss"


REQUESTS_TABLE_FIRST_VIEW = 8
"""How many of the Requests table's columns a 1400-pixel-wide window shows before it scrolls sideways."""


def request_table_rows(rows: Sequence[RequestRow]) -> list[dict[str, Any]]:
    """The Requests table, one dict per request, newest first (as given)."""
    table = []
    for row in rows:
        share = None
        if row.prompt_tokens and row.cached_tokens is not None:
            share = row.cached_tokens / row.prompt_tokens
        table.append(
            {
                # The cache figures first: at 1400 px the table shows about eight columns before it scrolls.
                "time (UTC)": row.created_at.replace(tzinfo=None),
                "tenant": row.tenant,
                "hit/miss": _hit_label(row),
                "prompt tokens": row.prompt_tokens,
                "cached tokens": row.cached_tokens,
                "cached share": share,
                "tokens lost": row.recomputed_tokens,
                "reason": row.miss_reason or "",
                "segment": row.divergence_segment or "",
                "offset": row.divergence_char_offset,
                "miss kind": row.miss_kind or "",
                "model": row.model,
                "TTFT ms": None if row.ttft_ms is None else round(row.ttft_ms, 1),
                "TTFT from": row.ttft_source or "",
                "status": row.status_code,
                "rules": ", ".join(row.applied_rules),
                "request id": row.request_id,
            }
        )
    return table
