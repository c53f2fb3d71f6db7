"""Replica sets: hit rate and load per replica over time, and how well the router predicted each replica's match.

Both read request rows (through the `(replica, created_at)` index) of requests that a replica set routed, i.e. with
a `replica`; exact times, not whole hours. "Load" is the replica's share of the requests (and prompt tokens) in
each bucket: what the router sent where.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import BigInteger, Integer, and_, case, cast, func, select

from db.dialect import bucket_index
from db.models import RequestRecordRow, table_of
from db.queries.history import bucket_geometry
from db.queries.results_replicas import ReplicaBucket, RouterAccuracy
from db.queries.totals import Reader
from db.timeutil import as_utc, utc_now

REQUESTS = table_of(RequestRecordRow)


def _sum(column):
    return cast(func.coalesce(func.sum(column), 0), BigInteger)


def _routed(since: datetime, until: datetime | None, upstream: str | None) -> list:
    table = REQUESTS
    filters = [
        table.c.replica.is_not(None),
        table.c.created_at >= as_utc(since),
        table.c.created_at < (as_utc(until) if until is not None else utc_now()),
    ]
    if upstream is not None:
        filters.append(table.c.upstream == upstream)
    return filters


def replica_history(
    conn: Reader, since: datetime, until: datetime | None = None, bucket: str = "1h", upstream: str | None = None
) -> list[ReplicaBucket]:
    """Per time bucket and replica: requests, prompt and cached tokens (token hit rate = cached / prompt over the
    requests whose counts are known), the eligible tokens (prompt - new) and their cached tokens over the requests
    with a token ledger (eligible hit rate), and the replica's share of the bucket's requests; ordered by bucket,
    replica."""
    size_s, offset_s = bucket_geometry(bucket)
    table = REQUESTS
    index = bucket_index(conn, table.c.created_at, size_s, offset_s).label("bucket_index")
    known = and_(table.c.prompt_tokens.is_not(None), table.c.cached_tokens.is_not(None))
    in_ledger = and_(known, table.c.new_tokens.is_not(None))
    stmt = (
        select(
            index,
            table.c.replica,
            func.count().label("requests"),
            _sum(case((known, table.c.prompt_tokens), else_=0)).label("prompt_tokens"),
            _sum(case((known, table.c.cached_tokens), else_=0)).label("cached_tokens"),
            _sum(case((in_ledger, table.c.prompt_tokens - table.c.new_tokens), else_=0)).label("eligible_tokens"),
            _sum(case((in_ledger, table.c.cached_tokens), else_=0)).label("eligible_cached_tokens"),
        )
        .where(*_routed(since, until, upstream))
        .group_by(index, table.c.replica)
        .order_by(index, table.c.replica)
    )
    rows = list(conn.execute(stmt))
    per_bucket: dict[int, int] = {}
    for row in rows:
        per_bucket[int(row.bucket_index)] = per_bucket.get(int(row.bucket_index), 0) + int(row.requests)
    return [
        ReplicaBucket(
            bucket_start=datetime.fromtimestamp(int(row.bucket_index) * size_s + offset_s, UTC),
            replica=row.replica,
            requests=int(row.requests),
            prompt_tokens=int(row.prompt_tokens),
            cached_tokens=int(row.cached_tokens),
            request_share=int(row.requests) / per_bucket[int(row.bucket_index)],
            eligible_tokens=int(row.eligible_tokens),
            eligible_cached_tokens=int(row.eligible_cached_tokens),
        )
        for row in rows
    ]


def router_accuracy(
    conn: Reader, since: datetime, until: datetime | None = None, upstream: str | None = None
) -> list[RouterAccuracy]:
    """Per replica and index source, over answered requests with both a prediction and the engine's cached tokens:
    predicted vs actual cached tokens, the share where the router was right about hit or miss, and the mean absolute
    error in tokens. Ordered by replica, then source."""
    table = REQUESTS
    scored = [
        *_routed(since, until, upstream),
        table.c.predicted_match_tokens.is_not(None),
        table.c.cached_tokens.is_not(None),
        table.c.routing_index_source.is_not(None),
        table.c.status_code < 400,
    ]
    agree = case(((table.c.predicted_match_tokens > 0) == (table.c.cached_tokens > 0), 1), else_=0)
    error = func.abs(table.c.predicted_match_tokens - table.c.cached_tokens)
    stmt = (
        select(
            table.c.replica,
            table.c.routing_index_source,
            func.count().label("requests"),
            _sum(table.c.predicted_match_tokens).label("predicted"),
            _sum(table.c.cached_tokens).label("actual"),
            cast(func.sum(agree), Integer).label("agree"),
            _sum(error).label("abs_error"),
        )
        .where(*scored)
        .group_by(table.c.replica, table.c.routing_index_source)
        .order_by(table.c.replica, table.c.routing_index_source)
    )
    return [
        RouterAccuracy(
            replica=row.replica,
            index_source=row.routing_index_source,
            requests=int(row.requests),
            predicted_tokens=int(row.predicted),
            actual_cached_tokens=int(row.actual),
            hit_miss_agreement=int(row.agree) / int(row.requests),
            mean_abs_error_tokens=int(row.abs_error) / int(row.requests),
        )
        for row in conn.execute(stmt)
    ]
