"""What each page reads, as plain functions of a SQLAlchemy connection: compositions of `db.queries` calls.

No Streamlit and no SQL here. `dashboard.data` wraps these with `st.cache_data` for the pages, and
`prefixscope bench dashboard` times the very same functions, so the benchmark measures what a page waits for.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection

from dashboard.prices import ModelUsage
from db import queries
from db.queries import LabelCount, Overview, PrefixRow, RequestRow, StatsRow
from db.records import RequestRecord

RECENT_REQUESTS_LIMIT = 500
# `db.queries.top_prefixes` groups request rows (there is no prefix rollup), which takes about 1 s per million rows
# on SQLite; the prefix table therefore covers at most this much of the chosen range, so the page stays under 2 s.
PREFIX_SCAN_MAX_SPAN = timedelta(days=7)
TOP_PREFIXES_LIMIT = 25
LABEL_SCAN_REQUESTS = 10


def bucket_for_span(span: timedelta) -> str:
    """A chart bucket that keeps a series between roughly 24 and 200 points."""
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
class TenantFigures:
    tenant: str
    figures: Overview


@dataclass(frozen=True)
class PrefixesData:
    prefixes: list[PrefixRow]
    # Start of the range the prefix table covers (later than the chosen `since` when the range is long).
    prefixes_since: datetime
    # prefix_hash -> the start of a stored prompt using it, for prefixes whose newest request kept its text.
    labels: dict[str, str]
    rules: list[LabelCount]
    requests_in_range: int
    tenants: list[TenantFigures]


def load_catalog(conn: Connection) -> Catalog:
    return Catalog(tenants=list(queries.tenants(conn)), models=list(queries.models(conn)))


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
) -> list[RequestRow]:
    """The Requests page's table: newest requests in the range matching the filters."""
    return queries.recent_requests(
        conn, limit=limit, tenant=tenant, model=model, hit=hit, miss_kind=miss_kind, since=since, until=until
    )


def load_request_detail(conn: Connection, request_id: str) -> RequestRecord | None:
    return queries.request_detail(conn, request_id)


def _prompt_label(text: str, max_chars: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= max_chars else flat[: max_chars - 1] + "…"


def load_prefix_labels(conn: Connection, prefix_hashes: list[str]) -> dict[str, str]:
    """A short label per prefix: the start of the newest stored prompt among its last few requests.

    Prompts are stored only for tenants that opted in (and perhaps sampled), so each prefix's newest
    `LABEL_SCAN_REQUESTS` requests are looked at, newest first, by primary key.
    """
    labels: dict[str, str] = {}
    for prefix_hash in prefix_hashes:
        for row in queries.recent_requests(conn, limit=LABEL_SCAN_REQUESTS, prefix_hash=prefix_hash):
            detail = queries.request_detail(conn, row.request_id)
            if detail is not None and detail.prompt_text:
                labels[prefix_hash] = _prompt_label(detail.prompt_text)
                break
    return labels


def load_tenant_figures(conn: Connection, since: datetime, until: datetime, tenants: list[str]) -> list[TenantFigures]:
    """Each tenant's totals over the range (one rollup query per tenant)."""
    return [TenantFigures(name, queries.overview(conn, since, until, tenant=name)) for name in tenants]


def load_prefixes(
    conn: Connection, since: datetime, until: datetime, tenant: str | None, limit: int = TOP_PREFIXES_LIMIT
) -> PrefixesData:
    """The Prefixes and rules page: top prefixes, their labels, rule counts and the tenants table."""
    prefixes_since = max(since, until - PREFIX_SCAN_MAX_SPAN)
    prefixes = queries.top_prefixes(conn, prefixes_since, until, limit=limit, tenant=tenant, order_by="cached_tokens")
    labels = load_prefix_labels(conn, [row.prefix_hash for row in prefixes])
    rules = queries.rule_counts(conn, since, until, tenant=tenant)
    requests_in_range = queries.overview(conn, since, until, tenant=tenant).requests
    names = [tenant] if tenant is not None else list(queries.tenants(conn))
    return PrefixesData(
        prefixes=prefixes,
        prefixes_since=prefixes_since,
        labels=labels,
        rules=rules,
        requests_in_range=requests_in_range,
        tenants=load_tenant_figures(conn, since, until, names),
    )


def load_model_usage(conn: Connection, since: datetime, until: datetime, tenant: str | None) -> list[ModelUsage]:
    """Prompt and cached tokens per model over the range, for the Cost page (one rollup query per model)."""
    usage = []
    for model in queries.models(conn):
        totals = queries.overview(conn, since, until, tenant=tenant, model=model)
        if totals.requests:
            usage.append(
                ModelUsage(model=model, prompt_tokens=totals.prompt_tokens, cached_tokens=totals.cached_tokens)
            )
    return usage
