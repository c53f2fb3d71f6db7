"""What each page reads, as plain functions of a SQLAlchemy connection: compositions of `db.queries` calls.

No Streamlit and no SQL here. `dashboard.data` wraps these with `st.cache_data` for the pages, and
`prefixscope bench dashboard` times the very same functions, so the benchmark measures what a page waits for.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection

from dashboard.prices import ModelUsage
from db.engine_context import EngineContext, latest_engine_context
from db import queries
from db.queries import GroupTotals, LabelCount, Overview, PrefixRow, RequestRow, StatsRow
from db.records import RequestRecord

RECENT_REQUESTS_LIMIT = 500
TOP_PREFIXES_LIMIT = 25


CHART_MINUTES_UP_TO = timedelta(hours=6)
"""Ranges up to this long are charted in minute buckets (summed from the request rows; the rollups are hourly)."""


def bucket_for_span(span: timedelta) -> str:
    """The bucket every page charts a time range of length `span` in: minute buckets up to `CHART_MINUTES_UP_TO`
    (1m up to an hour, else 5m), then hourly ones that keep a series between roughly 24 and 200 points."""
    if span <= timedelta(hours=1):
        return "1m"
    if span <= CHART_MINUTES_UP_TO:
        return "5m"
    if span <= timedelta(days=3):
        return "1h"
    if span <= timedelta(days=14):
        return "4h"
    if span <= timedelta(days=120):
        return "1d"
    return "1w"


@dataclass(frozen=True)
class Catalog:
    """Names for the filter drop-downs."""

    tenants: list[str]
    models: list[str]
    # When the oldest recorded request happened (its hour), for a default time range that fits the data.
    first_seen: datetime | None = None

    @property
    def is_empty(self) -> bool:
        return not self.tenants and not self.models


@dataclass(frozen=True)
class OverviewData:
    totals: Overview
    series: list[StatsRow]
    bucket: str
    # Start of the bucket holding `since`: where the charts' time axis begins.
    first_bucket_start: datetime


@dataclass(frozen=True)
class PrefixesData:
    prefixes: list[PrefixRow]
    # prefix_hash -> the start of the newest stored prompt using it, for prefixes with any stored prompt.
    labels: dict[str, str]
    rules: list[LabelCount]
    requests_in_range: int
    # One row per tenant (`group`), registered tenants without requests in the range included with zeros.
    tenants: list[GroupTotals]


def load_catalog(conn: Connection) -> Catalog:
    return Catalog(
        tenants=list(queries.tenants(conn)), models=list(queries.models(conn)), first_seen=queries.first_seen(conn)
    )


def load_engine_context(conn: Connection) -> EngineContext | None:
    """The engine context recorded with this database's history (its prefill speed and cache settings), if any."""
    return latest_engine_context(conn)


def load_namespace_tenants(conn: Connection) -> dict[str, str]:
    """Engine namespace label -> tenant, from the database (the engine never knows tenant names)."""
    return queries.namespace_tenants(conn)


def load_overview(
    conn: Connection, since: datetime, until: datetime, tenant: str | None, model: str | None
) -> OverviewData:
    """Totals and the time series for the Overview page."""
    bucket = bucket_for_span(until - since)
    totals = queries.overview(conn, since, until, tenant=tenant, model=model)
    series = queries.stats(conn, since, until, bucket=bucket, tenant=tenant, model=model)
    return OverviewData(
        totals=totals, series=series, bucket=bucket, first_bucket_start=queries.bucket_floor(since, bucket)
    )


def load_recent_requests(
    conn: Connection,
    since: datetime,
    until: datetime,
    tenant: str | None,
    model: str | None,
    hit: bool | None,
    miss_kind: str | None,
    limit: int = RECENT_REQUESTS_LIMIT,
    miss_reason: str | None = None,
) -> list[RequestRow]:
    """The Requests page's table: newest requests in the range matching the filters."""
    return queries.recent_requests(
        conn,
        limit=limit,
        tenant=tenant,
        model=model,
        hit=hit,
        miss_kind=miss_kind,
        since=since,
        until=until,
        miss_reason=miss_reason,
    )


def load_request_detail(conn: Connection, request_id: str) -> RequestRecord | None:
    return queries.request_detail(conn, request_id)


def load_prefixes(
    conn: Connection, since: datetime, until: datetime, tenant: str | None, limit: int = TOP_PREFIXES_LIMIT
) -> PrefixesData:
    """The Prefixes and rules page: top prefixes and their labels, rule counts and the tenants table, all from the
    rollups except the labels (one probe of a partial index per prefix)."""
    prefixes = queries.top_prefixes(conn, since, until, limit=limit, tenant=tenant, order_by="cached_tokens")
    labels = queries.prefix_labels(conn, [row.prefix_hash for row in prefixes])
    rules = queries.rule_counts(conn, since, until, tenant=tenant)
    with_traffic = queries.totals_by(conn, since, until, group_by="tenant", tenant=tenant)
    names = [tenant] if tenant is not None else list(queries.tenants(conn))
    present = {row.group for row in with_traffic}
    idle = [GroupTotals(group=name) for name in names if name not in present]
    return PrefixesData(
        prefixes=prefixes,
        labels=labels,
        rules=rules,
        requests_in_range=sum(row.requests for row in with_traffic),
        tenants=sorted([*with_traffic, *idle], key=lambda row: row.group),
    )


def load_model_usage(conn: Connection, since: datetime, until: datetime, tenant: str | None) -> list[ModelUsage]:
    """Prompt and cached tokens per model with requests in the range, for the Cost page (one rollup query)."""
    per_model = queries.totals_by(conn, since, until, group_by="model", tenant=tenant, quantiles=False)
    return [
        ModelUsage(model=row.group, prompt_tokens=row.prompt_tokens, cached_tokens=row.cached_tokens)
        for row in per_model
    ]
