"""Minute buckets for short ranges, computed from the request rows (the rollups are hourly).

A fresh install has minutes of traffic: hourly points put it all in one dot. For ranges up to
`MAX_MINUTE_RANGE` the request rows themselves are summed per 1, 5 or 15 minutes, with exactly the rollups'
arithmetic (`db.rollups.RollupAccumulator` with a minute floor), so a minute series and an hourly one agree.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from sqlalchemy import literal, select

from db.models import RequestRecordRow, table_of
from db.queries.groups import group_label
from db.queries.results import MissReasonRow, StatsRow
from db.queries.totals import Reader, Totals
from db.rollups import DIMENSION_RETENTION, RollupAccumulator
from db.store import row_to_record

MINUTE_BUCKETS: Final[dict[str, timedelta]] = {
    "1m": timedelta(minutes=1),
    "5m": timedelta(minutes=5),
    "15m": timedelta(minutes=15),
}
MAX_MINUTE_RANGE: Final = timedelta(hours=24)
REQUESTS = table_of(RequestRecordRow)
_COLUMNS = [column for column in REQUESTS.c if column.name != "prompt_text"]


def minute_floor(moment: datetime, bucket: str) -> datetime:
    size_s = int(MINUTE_BUCKETS[bucket].total_seconds())
    return datetime.fromtimestamp(int(moment.timestamp()) // size_s * size_s, UTC)


def minute_accumulator(
    conn: Reader,
    start: datetime,
    end: datetime,
    bucket: str,
    tenant: str | None = None,
    model: str | None = None,
) -> RollupAccumulator:
    """The rollups of the request rows in [start, end), per `bucket` (1m, 5m or 15m) instead of per hour: every
    minute series (`minute_stats`, `minute_miss_reasons`) is summed by this one function. Raises ValueError past
    `MAX_MINUTE_RANGE`."""
    if end - start > MAX_MINUTE_RANGE:
        hours = MAX_MINUTE_RANGE // timedelta(hours=1)
        raise ValueError(f"minute buckets cover at most {hours} hours; pick an hourly bucket for longer ranges")
    clauses = [REQUESTS.c.created_at >= start, REQUESTS.c.created_at < end]
    if tenant is not None:
        clauses.append(REQUESTS.c.tenant == tenant)
    if model is not None:
        clauses.append(REQUESTS.c.model == model)
    stmt = select(*_COLUMNS, literal(None).label("prompt_text")).where(*clauses)
    accumulator = RollupAccumulator(floor=lambda moment: minute_floor(moment, bucket))
    accumulator.add_all(row_to_record(row) for row in conn.execute(stmt))
    return accumulator


def minute_miss_reasons(
    conn: Reader, start: datetime, end: datetime, bucket: str, tenant: str | None = None
) -> list[MissReasonRow]:
    """Requests and recomputed tokens per miss reason and minute bucket over [start, end), ordered by bucket then
    reason (the minute form of `db.queries.misses.miss_reasons_over_time`)."""
    totals: dict[tuple[datetime, str], list[int]] = defaultdict(lambda: [0, 0])
    for row in minute_accumulator(conn, start, end, bucket, tenant).miss_reason_rows():
        sums = totals[(row["bucket_start"], row["miss_reason"])]
        sums[0] += int(row["requests"])
        sums[1] += int(row["recomputed_tokens"])
    return [
        MissReasonRow(bucket_start=bucket_start, reason=reason, requests=requests, recomputed_tokens=tokens)
        for (bucket_start, reason), (requests, tokens) in sorted(totals.items())
    ]


def minute_stats(
    conn: Reader,
    start: datetime,
    end: datetime,
    bucket: str,
    group_by: str | None = None,
    tenant: str | None = None,
    model: str | None = None,
) -> list[StatsRow]:
    """Cache figures per minute bucket over [start, end) from the request rows; raises ValueError past
    `MAX_MINUTE_RANGE`."""
    accumulator = minute_accumulator(conn, start, end, bucket, tenant, model)
    groups: dict[tuple[datetime, str | None], Totals] = defaultdict(Totals)

    def key_of(row: dict[str, Any]) -> tuple[datetime, str | None]:
        return row["bucket_start"], group_label(row[group_by], group_by) if group_by is not None else None

    for row in accumulator.rollup_rows():
        groups[key_of(row)].add_sums(row)
    for row in accumulator.ttft_bin_rows():
        groups[key_of(row)].add_bin(row["cache_state"], row["bin"], row["requests"], row["ttft_min_ms"],
                                    row["ttft_max_ms"])
    for row in accumulator.label_rows():
        if row["dimension"] == DIMENSION_RETENTION:
            groups[key_of(row)].add_retention(row["value"], row["requests"])
    return [
        StatsRow(bucket_start=bucket_start, group=group, **totals.figures())
        for (bucket_start, group), totals in sorted(groups.items(), key=lambda item: (item[0][0], item[0][1] or ""))
        if totals.sums["requests"] > 0
    ]
