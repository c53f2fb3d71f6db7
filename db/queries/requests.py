"""Queries over individual request rows: the explorer's list and one request in full.

Each is served by an index on `requests` that leads with the filtered column and ends with `created_at`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Row, func, select

from db.models import RequestRecordRow, table_of
from db.queries.results import RequestRow
from db.queries.totals import Reader
from db.record_schema import listed_fields
from db.records import RequestRecord
from db.store import CHAINS, row_to_chain, row_to_record, row_values
from db.timeutil import as_utc

REQUESTS = table_of(RequestRecordRow)
LISTED = listed_fields(RequestRecord)
LISTED_COLUMNS = [REQUESTS.c[item.column] for item in LISTED]


def request_row(row: Row[Any]) -> RequestRow:
    """A `RequestRow` from a result row of `LISTED_COLUMNS`."""
    return RequestRow(**row_values(row, LISTED))


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
    miss_reason: str | None = None,
) -> list[RequestRow]:
    """The newest requests matching every given filter, newest first.

    `hit=True` keeps requests that reused more than the template's fixed opening, `hit=False` known misses (nothing
    beyond it); `until` is exclusive,
    so passing the last row's `created_at` pages further back.
    """
    clauses: list[ColumnElement[bool]] = []
    for column, value in (
        ("tenant", tenant),
        ("model", model),
        ("miss_kind", miss_kind),
        ("upstream", upstream),
        ("prefix_hash", prefix_hash),
        ("miss_reason", miss_reason),
    ):
        if value is not None:
            clauses.append(REQUESTS.c[column] == value)
    opening = func.coalesce(REQUESTS.c.template_tokens, 0)
    if hit is True:
        clauses.append(REQUESTS.c.cached_tokens > opening)
    elif hit is False:
        clauses.append(REQUESTS.c.cached_tokens <= opening)
    if since is not None:
        clauses.append(REQUESTS.c.created_at >= as_utc(since))
    if until is not None:
        clauses.append(REQUESTS.c.created_at < as_utc(until))
    stmt = (
        select(*LISTED_COLUMNS)
        .where(*clauses)
        .order_by(REQUESTS.c.created_at.desc(), REQUESTS.c.id.desc())
        .limit(max(0, limit))
    )
    return [request_row(row) for row in conn.execute(stmt)]


def request_detail(conn: Reader, request_id: str) -> RequestRecord | None:
    """Everything stored about one request (prompt text and hash chain included, where stored), or None."""
    row = conn.execute(select(REQUESTS).where(REQUESTS.c.id == request_id)).first()
    if row is None:
        return None
    chain_row = conn.execute(select(CHAINS).where(CHAINS.c.request_id == request_id)).first()
    return row_to_record(row, None if chain_row is None else row_to_chain(chain_row))
