"""Reading request hash chains back, in time order, for the what-if cache simulator."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import ColumnElement, select

from db.chains import RequestChain
from db.queries.totals import Reader
from db.store import CHAINS, row_to_chain
from db.timeutil import as_utc

CHAIN_CHUNK_ROWS = 1000


class ChainEntry(NamedTuple):
    """One request's chain as `iter_chains` yields it; unpacks as `(created_at, tenant, chain)`."""

    created_at: datetime
    tenant: str
    chain: RequestChain


def iter_chains(
    conn: Reader,
    since: datetime,
    until: datetime | None = None,
    tenant: str | None = None,
    chunk_rows: int = CHAIN_CHUNK_ROWS,
) -> Iterator[ChainEntry]:
    """Every stored chain created in [since, until) (exact times; `until=None` means no end), oldest first.

    Rows are streamed `chunk_rows` at a time (a server-side cursor on PostgreSQL), so a trace of millions of blocks
    never sits in memory at once. Consume the iterator while `conn` is open.
    """
    clauses: list[ColumnElement[bool]] = [CHAINS.c.created_at >= as_utc(since)]
    if until is not None:
        clauses.append(CHAINS.c.created_at < as_utc(until))
    if tenant is not None:
        clauses.append(CHAINS.c.tenant == tenant)
    stmt = (
        select(CHAINS)
        .where(*clauses)
        .order_by(CHAINS.c.created_at, CHAINS.c.request_id)
        .execution_options(yield_per=max(1, chunk_rows))
    )
    for row in conn.execute(stmt):
        yield ChainEntry(created_at=row.created_at, tenant=row.tenant, chain=row_to_chain(row))
