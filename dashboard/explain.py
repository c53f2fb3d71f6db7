"""Words and table rows for requests: what a miss kind means, and the Requests table's columns."""

from __future__ import annotations

from collections.abc import Sequence
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


def _hit_label(row: RequestRow) -> str:
    if row.cache_hit is None:
        return "error" if row.status_code >= 400 else "unknown"
    return "hit" if row.cache_hit else "miss"


def request_table_rows(rows: Sequence[RequestRow]) -> list[dict[str, Any]]:
    """The Requests table, one dict per request, newest first (as given)."""
    table = []
    for row in rows:
        share = None
        if row.prompt_tokens and row.cached_tokens is not None:
            share = row.cached_tokens / row.prompt_tokens
        table.append(
            {
                "time (UTC)": row.created_at.replace(tzinfo=None),
                "tenant": row.tenant,
                "model": row.model,
                "hit/miss": _hit_label(row),
                "miss kind": row.miss_kind or "",
                "prompt tokens": row.prompt_tokens,
                "cached tokens": row.cached_tokens,
                "cached share": share,
                "TTFT ms": None if row.ttft_ms is None else round(row.ttft_ms, 1),
                "status": row.status_code,
                "rules": ", ".join(row.applied_rules),
                "request id": row.request_id,
            }
        )
    return table
