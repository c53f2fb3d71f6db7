"""Explaining misses: why requests missed over time, where prompts diverged, examples of a reason, and what
normalization gained.

Everything but `miss_examples` reads the hourly rollups (`hourly_miss_reasons`, `hourly_divergences`, the
normalization sums of `hourly_rollups`), so ranges are whole UTC hours as in `db.queries.history`. `miss_examples`
reads request rows through the `(miss_reason, created_at)` index.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import BigInteger, ColumnElement, cast, func, select

from db.dialect import bucket_index
from db.models import HourlyDivergence, HourlyMissReason, table_of
from db.queries.history import bucket_geometry, query_range
from db.queries.minutes import MINUTE_BUCKETS, minute_miss_reasons
from db.queries.requests import recent_requests
from db.queries.results import DivergenceLocation, MissReasonRow, MissReasonTotal, NormalizationGains, RequestRow
from db.queries.totals import ROLLUPS, Reader, rollup_filters
from db.rollups import DIVERGENCE_BUCKET_CHARS
from db.timeutil import as_utc, utc_now

MISS_REASON_ROLLUPS = table_of(HourlyMissReason)
DIVERGENCES = table_of(HourlyDivergence)


def _sum(column: ColumnElement[int]) -> ColumnElement[int]:
    # PostgreSQL sums BIGINT into NUMERIC (a Decimal in Python); cast back.
    return cast(func.sum(column), BigInteger)


def miss_reasons_over_time(
    conn: Reader,
    since: datetime,
    until: datetime | None = None,
    bucket: str = "1h",
    tenant: str | None = None,
) -> list[MissReasonRow]:
    """Requests and recomputed tokens per miss reason and time bucket, ordered by bucket then reason.

    Buckets are those of `db.queries.stats`: `1h` ... `1w` from the hourly rollups, `1m`, `5m` and `15m` (ranges up
    to a day) from the request rows (`db.queries.minutes`); a bucket without requests of a reason has no row for it.
    """
    if bucket in MINUTE_BUCKETS:
        return minute_miss_reasons(conn, as_utc(since), as_utc(until or utc_now()), bucket, tenant)
    size_s, offset_s = bucket_geometry(bucket)
    start, end = query_range(since, until)
    table = MISS_REASON_ROLLUPS
    index = bucket_index(conn, table.c.bucket_start, size_s, offset_s).label("bucket_index")
    stmt = (
        select(
            index,
            table.c.miss_reason,
            _sum(table.c.requests).label("requests"),
            _sum(table.c.recomputed_tokens).label("recomputed_tokens"),
        )
        .where(*rollup_filters(table, start, end, tenant=tenant))
        .group_by(index, table.c.miss_reason)
        .order_by(index, table.c.miss_reason)
    )
    return [
        MissReasonRow(
            bucket_start=datetime.fromtimestamp(int(row.bucket_index) * size_s + offset_s, UTC),
            reason=row.miss_reason,
            requests=int(row.requests),
            recomputed_tokens=int(row.recomputed_tokens),
        )
        for row in conn.execute(stmt)
    ]


def miss_reason_totals(
    conn: Reader, since: datetime, until: datetime | None = None, tenant: str | None = None
) -> list[MissReasonTotal]:
    """Requests and recomputed tokens per miss reason over the whole range, most requests first."""
    start, end = query_range(since, until)
    table = MISS_REASON_ROLLUPS
    requests = _sum(table.c.requests).label("requests")
    stmt = (
        select(table.c.miss_reason, requests, _sum(table.c.recomputed_tokens).label("recomputed_tokens"))
        .where(*rollup_filters(table, start, end, tenant=tenant))
        .group_by(table.c.miss_reason)
        .order_by(requests.desc(), table.c.miss_reason)
    )
    return [
        MissReasonTotal(
            reason=row.miss_reason, requests=int(row.requests), recomputed_tokens=int(row.recomputed_tokens)
        )
        for row in conn.execute(stmt)
    ]


def divergence_locations(
    conn: Reader,
    since: datetime,
    until: datetime | None = None,
    limit: int = 20,
    tenant: str | None = None,
    offset_bucket_chars: int = DIVERGENCE_BUCKET_CHARS,
) -> list[DivergenceLocation]:
    """The most common places where prompts first differed from the cached prefix: (segment, character-offset
    bucket) with requests and recomputed tokens, most requests first.

    `offset_bucket_chars` must be a multiple of `DIVERGENCE_BUCKET_CHARS` (64), the granularity that is stored.
    """
    if offset_bucket_chars < DIVERGENCE_BUCKET_CHARS or offset_bucket_chars % DIVERGENCE_BUCKET_CHARS:
        raise ValueError(f"offset_bucket_chars must be a positive multiple of {DIVERGENCE_BUCKET_CHARS}")
    start, end = query_range(since, until)
    table = DIVERGENCES
    offset = (table.c.offset_bucket // offset_bucket_chars * offset_bucket_chars).label("offset_start")
    requests = _sum(table.c.requests).label("requests")
    recomputed = _sum(table.c.recomputed_tokens).label("recomputed_tokens")
    stmt = (
        select(table.c.segment, offset, requests, recomputed)
        .where(*rollup_filters(table, start, end, tenant=tenant))
        .group_by(table.c.segment, offset)
        .order_by(requests.desc(), recomputed.desc(), table.c.segment, offset)
        .limit(max(0, limit))
    )
    return [
        DivergenceLocation(
            segment=row.segment,
            char_offset_start=int(row.offset_start),
            char_offset_end=int(row.offset_start) + offset_bucket_chars,
            requests=int(row.requests),
            recomputed_tokens=int(row.recomputed_tokens),
        )
        for row in conn.execute(stmt)
    ]


def miss_examples(
    conn: Reader,
    reason: str,
    since: datetime,
    until: datetime | None = None,
    limit: int = 10,
    tenant: str | None = None,
) -> list[RequestRow]:
    """The newest requests in [since, until) with this miss reason, newest first (exact times, not whole hours)."""
    return recent_requests(conn, limit=limit, tenant=tenant, miss_reason=reason, since=since, until=until)


def normalization_gains(
    conn: Reader,
    since: datetime,
    until: datetime | None = None,
    tenant: str | None = None,
    model: str | None = None,
) -> NormalizationGains:
    """Totals over the requests whose normalization gain was measured (sampled) in the range."""
    start, end = query_range(since, until)
    columns = (
        "normalization_sampled_requests",
        "normalization_requests_with_gain",
        "normalization_gain_tokens",
        "normalization_prompt_tokens",
    )
    stmt = select(*(_sum(ROLLUPS.c[name]).label(name) for name in columns)).where(
        *rollup_filters(ROLLUPS, start, end, tenant=tenant, model=model)
    )
    row = conn.execute(stmt).one()
    return NormalizationGains(
        sampled_requests=int(row.normalization_sampled_requests or 0),
        requests_with_gain=int(row.normalization_requests_with_gain or 0),
        gain_tokens=int(row.normalization_gain_tokens or 0),
        prompt_tokens=int(row.normalization_prompt_tokens or 0),
    )
