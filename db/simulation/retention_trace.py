"""Reading stored requests as a retention trace: each request's block hash chain with its tenant's prefix, for the
what-if replay with a class per prefix (`db.simulation.retention`), and whether the request found its prefix evicted."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, select

from db.chains import unpack_hash_ids
from db.models import RequestChainRow, RequestRecordRow, table_of
from db.retention.reuse import was_evicted
from db.simulation.retention import RetentionRequest
from db.timeutil import as_utc

REQUESTS = table_of(RequestRecordRow)
CHAINS = table_of(RequestChainRow)
DEFAULT_MAX_ROWS = 200_000


def retention_trace(
    conn: Connection, since: datetime, until: datetime | None = None, tenant: str | None = None,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> list[RetentionRequest]:
    """The latest `max_rows` stored requests with a chain and a prefix hash, oldest first, as the what-if retention
    replay (`db.simulation.retention`) takes them: seconds since `since`, each keyed by tenant and prefix hash."""
    start = as_utc(since)
    clauses = [CHAINS.c.created_at >= start, REQUESTS.c.prefix_hash.is_not(None)]
    if until is not None:
        clauses.append(CHAINS.c.created_at < as_utc(until))
    if tenant is not None:
        clauses.append(CHAINS.c.tenant == tenant)
    stmt = (
        select(CHAINS.c.created_at, CHAINS.c.tenant, CHAINS.c.block_size, CHAINS.c.input_length, CHAINS.c.hash_ids,
               REQUESTS.c.prefix_hash, REQUESTS.c.lost_evicted_tokens, REQUESTS.c.miss_kind)
        .join(REQUESTS, REQUESTS.c.id == CHAINS.c.request_id)
        .where(*clauses)
        .order_by(CHAINS.c.created_at.desc(), CHAINS.c.request_id)
        .limit(max_rows)
    )
    rows = list(conn.execute(stmt))
    rows.reverse()
    return [
        RetentionRequest(
            (as_utc(row.created_at) - start).total_seconds(), int(row.input_length), unpack_hash_ids(row.hash_ids),
            int(row.block_size), prefix_key(row.tenant, row.prefix_hash),
            was_evicted(row.lost_evicted_tokens, row.miss_kind),
        )
        for row in rows
    ]


def prefix_key(tenant: str, prefix_hash: str) -> str:
    """The key of a tenant's prefix in a retention trace (prefix hashes are keyed per tenant, so the pair is unique)."""
    return f"{tenant}\x00{prefix_hash}"
