"""Counts of labelled requests from `hourly_label_counts`: normalization rules, miss kinds, error types, statuses."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, func, select

from db.models import HourlyLabelCount, table_of
from db.queries.results import LabelCount
from db.queries.totals import Reader, rollup_filters
from db.rollups import DIMENSION_RULE
from db.timeutil import as_utc, floor_hour, utc_now

LABELS = table_of(HourlyLabelCount)


def label_counts(
    conn: Reader,
    dimension: str,
    since: datetime,
    until: datetime | None = None,
    tenant: str | None = None,
    model: str | None = None,
) -> list[LabelCount]:
    """Requests per label of `dimension` (`rule`, `miss_kind`, `error_type`, `status`), most frequent first."""
    start = floor_hour(since)
    end = as_utc(until) if until is not None else utc_now()
    total = func.sum(LABELS.c.requests).label("requests")
    stmt = (
        select(LABELS.c.value, total)
        .where(LABELS.c.dimension == dimension, *rollup_filters(LABELS, start, end, tenant=tenant, model=model))
        .group_by(LABELS.c.value)
        .order_by(total.desc(), LABELS.c.value)
    )
    return [LabelCount(value=row.value, requests=int(row.requests)) for row in conn.execute(stmt)]


def summed_labels(
    conn: Reader, dimension: str, where: list[ColumnElement[bool]], group_columns: list[Any]
) -> list[Any]:
    """Rows of `group_columns`, the label `value` and its summed `requests`, for one dimension (the per-bucket or
    per-group counterpart of `label_counts`; build `where` and `group_columns` on `LABELS`)."""
    stmt = (
        select(*group_columns, LABELS.c.value, func.sum(LABELS.c.requests).label("requests"))
        .where(LABELS.c.dimension == dimension, *where)
        .group_by(*group_columns, LABELS.c.value)
    )
    return list(conn.execute(stmt).mappings())


def rule_counts(
    conn: Reader,
    since: datetime,
    until: datetime | None = None,
    tenant: str | None = None,
    model: str | None = None,
) -> list[LabelCount]:
    """How many requests each normalization rule changed in the range, most frequent first."""
    return label_counts(conn, DIMENSION_RULE, since, until, tenant=tenant, model=model)
