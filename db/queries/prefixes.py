"""Prompt prefix reuse: the most reused prefixes from `hourly_prefix_rollups`, and a readable label for each.

`top_prefixes` reads only the rollup, so its cost depends on hours x distinct prefixes in the range, not on request
count. `prefix_labels` finds each prefix's newest stored prompt through a partial index that holds only the rows
that kept their prompt text.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Final, Literal

from sqlalchemy import func, literal, select, union_all

from db.models import HourlyPrefixRollup, RequestRecordRow, table_of
from db.queries.results import PrefixRow
from db.queries.totals import Reader, rollup_filters
from db.timeutil import as_utc, floor_hour, utc_now

PREFIXES = table_of(HourlyPrefixRollup)
REQUESTS = table_of(RequestRecordRow)
LABEL_MAX_CHARS: Final = 60
# Enough of a stored prompt to label it; prompts can be long and only their start is shown.
_LABEL_SOURCE_CHARS: Final = 500
# SQLite allows at most 500 terms in one compound SELECT.
_LABELS_PER_STATEMENT: Final = 400


def top_prefixes(
    conn: Reader,
    since: datetime,
    until: datetime | None = None,
    limit: int = 20,
    tenant: str | None = None,
    order_by: Literal["requests", "cached_tokens"] = "requests",
) -> list[PrefixRow]:
    """The most reused prompt prefixes in [since, until) (whole UTC hours, as the other history queries): requests,
    hits, prompt and cached tokens per `prefix_hash`, and the first and last request time in the range.

    A prefix with many requests and few hits is one whose cache keeps being invalidated: the first place to look.
    """
    if order_by not in ("requests", "cached_tokens"):
        raise ValueError(f"order_by must be 'requests' or 'cached_tokens', got {order_by!r}")
    start = floor_hour(since)
    end = as_utc(until) if until is not None else utc_now()
    requests = func.sum(PREFIXES.c.requests).label("requests")
    hits = func.sum(PREFIXES.c.requests_with_hit).label("requests_with_hit")
    prompt = func.sum(PREFIXES.c.prompt_tokens).label("prompt_tokens")
    cached = func.sum(PREFIXES.c.cached_tokens).label("cached_tokens")
    first_seen = func.min(PREFIXES.c.first_seen).label("first_seen")
    last_seen = func.max(PREFIXES.c.last_seen).label("last_seen")
    primary, secondary = (requests, cached) if order_by == "requests" else (cached, requests)
    stmt = (
        select(PREFIXES.c.prefix_hash, requests, hits, prompt, cached, first_seen, last_seen)
        .where(*rollup_filters(PREFIXES, start, end, tenant=tenant))
        .group_by(PREFIXES.c.prefix_hash)
        .order_by(primary.desc(), secondary.desc(), PREFIXES.c.prefix_hash)
        .limit(max(0, limit))
    )
    return [
        PrefixRow(
            prefix_hash=row.prefix_hash,
            requests=int(row.requests),
            requests_with_hit=int(row.requests_with_hit),
            prompt_tokens=int(row.prompt_tokens),
            cached_tokens=int(row.cached_tokens),
            # min/max are expressions, so the UTC type does not apply: normalise here.
            first_seen=moment(row.first_seen),
            last_seen=moment(row.last_seen),
        )
        for row in conn.execute(stmt)
    ]


def prompt_label(text: str, max_chars: int = LABEL_MAX_CHARS) -> str:
    """The start of a prompt on one line, whitespace collapsed, cut to `max_chars` with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= max_chars else flat[: max_chars - 1] + "…"


def prefix_labels(conn: Reader, prefix_hashes: Iterable[str], max_chars: int = LABEL_MAX_CHARS) -> dict[str, str]:
    """A short label per prefix: the start of the newest stored prompt among the requests with that hash.

    Prefixes without any stored prompt (their tenant does not store prompts) are absent. One statement for up to
    400 prefixes; each lookup is one probe of a partial index, however many requests a prefix has.
    """
    wanted = list(dict.fromkeys(prefix_hashes))
    labels: dict[str, str] = {}
    for start in range(0, len(wanted), _LABELS_PER_STATEMENT):
        chunk = wanted[start : start + _LABELS_PER_STATEMENT]
        for prefix_hash, text in conn.execute(_newest_prompts(chunk)):
            if text:
                labels[prefix_hash] = prompt_label(text, max_chars)
    return labels


def _newest_prompts(prefix_hashes: list[str]) -> Any:
    """`(prefix_hash, start of its newest stored prompt or NULL)` for each hash, as one compound SELECT."""
    selects = []
    for prefix_hash in prefix_hashes:
        newest = (
            select(func.substr(REQUESTS.c.prompt_text, 1, _LABEL_SOURCE_CHARS))
            # The same condition as the partial index's, so that both databases use it.
            .where(REQUESTS.c.prefix_hash == prefix_hash, REQUESTS.c.prompt_text.is_not(None))
            .order_by(REQUESTS.c.created_at.desc())
            .limit(1)
            .scalar_subquery()
        )
        selects.append(select(literal(prefix_hash).label("prefix_hash"), newest.label("prompt_text")))
    return selects[0] if len(selects) == 1 else union_all(*selects)


def moment(value: datetime | str) -> datetime:
    """A timestamp from an aggregate (SQLite returns min/max over timestamps as text), in UTC."""
    if isinstance(value, str):
        return as_utc(datetime.fromisoformat(value))
    return as_utc(value)
