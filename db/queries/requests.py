"""Queries over individual request rows: the explorer's list, one request in full, prefix reuse.

Each is served by an index on `requests` that leads with the filtered column and ends with `created_at`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from sqlalchemy import ColumnElement, Row, case, func, select

from db.models import RequestRecordRow, table_of
from db.queries.results import PrefixRow, RequestRow
from db.queries.totals import Reader
from db.records import RequestRecord
from db.store import CHAINS, row_to_chain, row_to_record
from db.timeutil import as_utc, utc_now

REQUESTS = table_of(RequestRecordRow)
_LISTED_COLUMNS = [column for column in REQUESTS.c if column.name != "prompt_text"]


def _row(row: Row[Any]) -> RequestRow:
    values = dict(row._mapping)
    values["request_id"] = values.pop("id")
    values["stream"] = bool(values["stream"])
    values["applied_rules"] = tuple(values["applied_rules"] or ())
    return RequestRow(**values)


def recent_requests(
    conn: Reader,
    limit: int = 100,
    tenant: str | None = None,
    model: str | None = None,
    hit: bool | None = None,
    miss_kind: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    upstream: str | None = None,
    prefix_hash: str | None = None,
) -> list[RequestRow]:
    """The newest requests matching every given filter, newest first.

    `hit=True` keeps requests with cached tokens, `hit=False` known misses (0 cached tokens); `until` is exclusive,
    so passing the last row's `created_at` pages further back.
    """
    clauses: list[ColumnElement[bool]] = []
    for column, value in (
        ("tenant", tenant),
        ("model", model),
        ("miss_kind", miss_kind),
        ("upstream", upstream),
        ("prefix_hash", prefix_hash),
    ):
        if value is not None:
            clauses.append(REQUESTS.c[column] == value)
    if hit is True:
        clauses.append(REQUESTS.c.cached_tokens > 0)
    elif hit is False:
        clauses.append(REQUESTS.c.cached_tokens == 0)
    if since is not None:
        clauses.append(REQUESTS.c.created_at >= as_utc(since))
    if until is not None:
        clauses.append(REQUESTS.c.created_at < as_utc(until))
    stmt = (
        select(*_LISTED_COLUMNS)
        .where(*clauses)
        .order_by(REQUESTS.c.created_at.desc(), REQUESTS.c.id.desc())
        .limit(max(0, limit))
    )
    return [_row(row) for row in conn.execute(stmt)]


def request_detail(conn: Reader, request_id: str) -> RequestRecord | None:
    """Everything stored about one request (prompt text and hash chain included, where stored), or None."""
    row = conn.execute(select(REQUESTS).where(REQUESTS.c.id == request_id)).first()
    if row is None:
        return None
    chain_row = conn.execute(select(CHAINS).where(CHAINS.c.request_id == request_id)).first()
    return row_to_record(row, None if chain_row is None else row_to_chain(chain_row))


def top_prefixes(
    conn: Reader,
    since: datetime,
    until: datetime | None = None,
    limit: int = 20,
    tenant: str | None = None,
    order_by: Literal["requests", "cached_tokens"] = "requests",
) -> list[PrefixRow]:
    """The most reused prompt prefixes in [since, until): requests, hits and cached tokens per `prefix_hash`.

    A prefix with many requests and few hits is one whose cache keeps being invalidated: the first place to look.
    """
    if order_by not in ("requests", "cached_tokens"):
        raise ValueError(f"order_by must be 'requests' or 'cached_tokens', got {order_by!r}")
    end = as_utc(until) if until is not None else utc_now()
    requests = func.count().label("requests")
    hits = func.sum(case((REQUESTS.c.cached_tokens > 0, 1), else_=0)).label("requests_with_hit")
    cached = func.coalesce(func.sum(REQUESTS.c.cached_tokens), 0).label("cached_tokens")
    prompt = func.coalesce(func.sum(REQUESTS.c.prompt_tokens), 0).label("prompt_tokens")
    first_seen = func.min(REQUESTS.c.created_at).label("first_seen")
    last_seen = func.max(REQUESTS.c.created_at).label("last_seen")
    clauses: list[ColumnElement[bool]] = [
        REQUESTS.c.prefix_hash.is_not(None),
        REQUESTS.c.created_at >= as_utc(since),
        REQUESTS.c.created_at < end,
    ]
    if tenant is not None:
        clauses.append(REQUESTS.c.tenant == tenant)
    primary, secondary = (requests, cached) if order_by == "requests" else (cached, requests)
    stmt = (
        select(REQUESTS.c.prefix_hash, requests, hits, cached, prompt, first_seen, last_seen)
        .where(*clauses)
        .group_by(REQUESTS.c.prefix_hash)
        .order_by(primary.desc(), secondary.desc(), REQUESTS.c.prefix_hash)
        .limit(max(0, limit))
    )
    return [
        PrefixRow(
            prefix_hash=row.prefix_hash,
            requests=int(row.requests),
            requests_with_hit=int(row.requests_with_hit or 0),
            prompt_tokens=int(row.prompt_tokens),
            cached_tokens=int(row.cached_tokens),
            # min/max are expressions, so the UTC type does not apply: normalise here.
            first_seen=_moment(row.first_seen),
            last_seen=_moment(row.last_seen),
        )
        for row in conn.execute(stmt)
    ]


def _moment(value: datetime | str) -> datetime:
    if isinstance(value, str):  # SQLite returns aggregate results over timestamps as text
        return as_utc(datetime.fromisoformat(value))
    return as_utc(value)
