"""History from the hourly rollups: `stats` (a time series), `overview` (totals over a range) and `totals_by` (totals
over a range per tenant, model or upstream).

All read only the rollup tables, so their cost depends on hours x groups in the range, not on request count.
Ranges are whole UTC hours: an hour is counted when its start lies in [floor_hour(since), until).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

from db.dialect import bucket_index
from db.queries.labels import LABELS, label_counts, summed_labels
from db.queries.results import GroupTotals, Overview, StatsRow
from db.queries.totals import (
    BINS,
    ROLLUPS,
    Reader,
    Totals,
    rollup_filters,
    bin_args,
    summed_bins,
    summed_rollups,
)
from db.queries.groups import REJECTED_GROUP, group_label
from db.queries.minutes import MINUTE_BUCKETS, minute_stats
from db.rollups import DIMENSION_ERROR_TYPE, DIMENSION_MISS_KIND, DIMENSION_RETENTION
from db.timeutil import as_utc, floor_hour, utc_now

GroupBy = Literal["tenant", "model", "upstream"]
GROUP_BY_CHOICES: Final = ("tenant", "model", "upstream")
__all__ = ["REJECTED_GROUP", "group_label"]  # re-exported for callers of db.queries.history

# Bucket sizes `stats` accepts. Sub-day buckets divide the day evenly; weeks start on Monday (ISO 8601).
# Minute buckets (up to a day's range) are summed from the request rows (`db.queries.minutes`).
BUCKETS: Final[dict[str, timedelta]] = {
    **MINUTE_BUCKETS,
    "1h": timedelta(hours=1),
    "2h": timedelta(hours=2),
    "3h": timedelta(hours=3),
    "4h": timedelta(hours=4),
    "6h": timedelta(hours=6),
    "8h": timedelta(hours=8),
    "12h": timedelta(hours=12),
    "1d": timedelta(days=1),
    "1w": timedelta(weeks=1),
}


# Weeks start on Monday; 1970-01-01 was a Thursday, so Monday-aligned weeks are offset by four days from the epoch.
_WEEK_OFFSET_S: Final = 4 * 86400


def bucket_geometry(bucket: str) -> tuple[int, int]:
    """`(size_s, offset_s)`: bucket n covers [n * size_s + offset_s, (n + 1) * size_s + offset_s) in epoch seconds."""
    if bucket not in BUCKETS:
        raise ValueError(f"unknown bucket {bucket!r}; choose one of {', '.join(BUCKETS)}")
    size_s = int(BUCKETS[bucket].total_seconds())
    return size_s, (_WEEK_OFFSET_S if bucket == "1w" else 0)


def bucket_floor(moment: datetime, bucket: str) -> datetime:
    """The start of the `bucket`-sized UTC interval containing `moment` (days at midnight, weeks on Monday)."""
    size_s, offset_s = bucket_geometry(bucket)
    index = (int(as_utc(moment).timestamp()) - offset_s) // size_s
    return datetime.fromtimestamp(index * size_s + offset_s, UTC)


def query_range(since: datetime, until: datetime | None) -> tuple[datetime, datetime]:
    """`(floor_hour(since), until or now)`: the whole-hour range the rollup queries cover."""
    return floor_hour(since), as_utc(until) if until is not None else utc_now()


def stats(
    conn: Reader,
    since: datetime,
    until: datetime | None = None,
    bucket: str = "1h",
    group_by: GroupBy | None = None,
    tenant: str | None = None,
    model: str | None = None,
) -> list[StatsRow]:
    """Cache figures per time bucket, and per tenant, model or upstream when `group_by` is given.

    Rows are ordered by bucket then group; buckets without requests are absent. `until` defaults to now.
    """
    if group_by is not None and group_by not in GROUP_BY_CHOICES:
        raise ValueError(f"group_by must be one of {GROUP_BY_CHOICES} or None, got {group_by!r}")
    size_s, offset_s = bucket_geometry(bucket)
    start, end = query_range(since, until)
    if bucket in MINUTE_BUCKETS:
        return minute_stats(conn, as_utc(since), as_utc(until or utc_now()), bucket, group_by, tenant, model)
    groups: dict[tuple[datetime, str | None], Totals] = defaultdict(Totals)

    def group_columns(table: Any) -> list[Any]:
        # Hours are folded into larger buckets by the database: far fewer rows reach Python.
        columns = [bucket_index(conn, table.c.bucket_start, size_s, offset_s).label("bucket_index")]
        if group_by is not None:
            columns.append(table.c[group_by].label("grp"))
        return columns

    def key_of(row: Any) -> tuple[datetime, str | None]:
        bucket_start = datetime.fromtimestamp(int(row["bucket_index"]) * size_s + offset_s, UTC)
        return bucket_start, group_label(row["grp"], group_by) if group_by is not None else None

    for row in summed_rollups(
        conn, rollup_filters(ROLLUPS, start, end, tenant=tenant, model=model), group_columns(ROLLUPS)
    ):
        groups[key_of(row)].add_sums(row)
    for row in summed_bins(conn, rollup_filters(BINS, start, end, tenant=tenant, model=model), group_columns(BINS)):
        groups[key_of(row)].add_bin(*bin_args(row))
    labels_where = rollup_filters(LABELS, start, end, tenant=tenant, model=model)
    for row in summed_labels(conn, DIMENSION_RETENTION, labels_where, group_columns(LABELS)):
        groups[key_of(row)].add_retention(row["value"], row["requests"])
    return [
        StatsRow(bucket_start=bucket_start, group=group, **totals.figures())
        for (bucket_start, group), totals in sorted(groups.items(), key=lambda item: (item[0][0], item[0][1] or ""))
        if totals.sums["requests"] > 0
    ]


def overview(
    conn: Reader,
    since: datetime,
    until: datetime | None = None,
    tenant: str | None = None,
    model: str | None = None,
) -> Overview:
    """Totals over [since, until) (`until` defaults to now), optionally for one tenant and/or model."""
    start, end = query_range(since, until)
    totals = Totals()
    for row in summed_rollups(conn, rollup_filters(ROLLUPS, start, end, tenant=tenant, model=model), []):
        totals.add_sums(row)
    for row in summed_bins(conn, rollup_filters(BINS, start, end, tenant=tenant, model=model), []):
        totals.add_bin(*bin_args(row))
    for item in label_counts(conn, DIMENSION_RETENTION, start, end, tenant=tenant, model=model):
        totals.add_retention(item.value, item.requests)
    miss_kinds = label_counts(conn, DIMENSION_MISS_KIND, start, end, tenant=tenant, model=model)
    error_types = label_counts(conn, DIMENSION_ERROR_TYPE, start, end, tenant=tenant, model=model)
    return Overview(
        since=start,
        until=end,
        miss_kinds={item.value: item.requests for item in miss_kinds},
        error_types={item.value: item.requests for item in error_types},
        **totals.figures(),
    )


def totals_by(
    conn: Reader,
    since: datetime,
    until: datetime | None = None,
    group_by: GroupBy = "tenant",
    tenant: str | None = None,
    quantiles: bool = True,
) -> list[GroupTotals]:
    """Totals over [since, until) for each tenant, model or upstream with requests in the range, by group name.

    One query over `hourly_rollups` whatever the number of groups, one over the retention labels, plus one over the
    TTFT bins for the quantiles (`quantiles=False` skips it and leaves the TTFT quantiles None, e.g. when only token
    counts are wanted).
    """
    if group_by not in GROUP_BY_CHOICES:
        raise ValueError(f"group_by must be one of {GROUP_BY_CHOICES}, got {group_by!r}")
    start, end = query_range(since, until)
    groups: dict[str, Totals] = defaultdict(Totals)
    for row in summed_rollups(
        conn, rollup_filters(ROLLUPS, start, end, tenant=tenant), [ROLLUPS.c[group_by].label("grp")]
    ):
        groups[group_label(row["grp"], group_by) or ""].add_sums(row)
    if quantiles:
        for row in summed_bins(conn, rollup_filters(BINS, start, end, tenant=tenant), [BINS.c[group_by].label("grp")]):
            groups[group_label(row["grp"], group_by) or ""].add_bin(*bin_args(row))
    labels_where = rollup_filters(LABELS, start, end, tenant=tenant)
    for row in summed_labels(conn, DIMENSION_RETENTION, labels_where, [LABELS.c[group_by].label("grp")]):
        groups[group_label(row["grp"], group_by) or ""].add_retention(row["value"], row["requests"])
    return [
        GroupTotals(group=name, **totals.figures())
        for name, totals in sorted(groups.items())
        if totals.sums["requests"] > 0
    ]
