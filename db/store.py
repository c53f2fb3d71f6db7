"""Writing request records: `requests` rows and their rollups in one transaction, idempotent by request id.

These are sync functions on a `Connection`; the async writer runs them with `AsyncConnection.run_sync`, the demo
data generator and maintenance commands call them directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, select

from db.dialect import upsert_insert
from db.models import HourlyLabelCount, HourlyRollup, HourlyTtftBin, RequestRecordRow, table_of
from db.records import RequestRecord
from db.rollups import RollupAccumulator, apply_rollups
from db.timeutil import as_utc

REQUESTS = table_of(RequestRecordRow)


@dataclass(frozen=True)
class StoreResult:
    """What `store_records` did: rows inserted, and records skipped because their id was already stored."""

    inserted: int
    duplicates: int


def record_to_row(record: RequestRecord) -> dict[str, Any]:
    """The `requests` row (column name to value) for a record."""
    return {
        "id": record.request_id,
        "created_at": record.created_at,
        "tenant": record.tenant,
        "key_id": record.key_id,
        "endpoint": record.endpoint,
        "model": record.model,
        "upstream": record.upstream,
        "stream": record.stream,
        "status_code": record.status_code,
        "error_type": record.error_type,
        "prompt_tokens": record.prompt_tokens,
        "cached_tokens": record.cached_tokens,
        "completion_tokens": record.completion_tokens,
        "ttft_ms": record.ttft_ms,
        "latency_ms": record.latency_ms,
        "applied_rules": list(record.applied_rules),
        "miss_kind": record.miss_kind,
        "prefix_hash": record.prefix_hash,
        "diverged_at_token": record.diverged_at_token,
        "prompt_text": record.prompt_text,
    }


def row_to_record(row: Any) -> RequestRecord:
    """A `RequestRecord` from a `requests` row (ORM object or a result row with the column names)."""
    return RequestRecord(
        request_id=row.id,
        created_at=row.created_at,
        tenant=row.tenant,
        key_id=row.key_id,
        endpoint=row.endpoint,
        model=row.model,
        upstream=row.upstream,
        stream=bool(row.stream),
        status_code=row.status_code,
        error_type=row.error_type,
        prompt_tokens=row.prompt_tokens,
        cached_tokens=row.cached_tokens,
        completion_tokens=row.completion_tokens,
        ttft_ms=row.ttft_ms,
        latency_ms=row.latency_ms,
        applied_rules=tuple(row.applied_rules or ()),
        miss_kind=row.miss_kind,
        prefix_hash=row.prefix_hash,
        prompt_text=row.prompt_text,
        diverged_at_token=row.diverged_at_token,
    )


def store_records(conn: Connection, records: Sequence[RequestRecord]) -> StoreResult:
    """Insert the records and add them to the rollups, in the caller's transaction.

    Records whose id is already stored (or repeated within `records`) are skipped and left out of the rollups, so
    storing the same record twice (a replayed spill file after a commit whose acknowledgement was lost) never
    double counts. The insert itself reports which rows it added (`ON CONFLICT DO NOTHING RETURNING id`), which
    holds even when another writer stores the same id at the same moment.
    """
    unique: dict[str, RequestRecord] = {}
    for record in records:
        unique.setdefault(record.request_id, record)
    if not unique:
        return StoreResult(inserted=0, duplicates=len(records))
    stmt = upsert_insert(conn, REQUESTS).on_conflict_do_nothing(index_elements=["id"]).returning(REQUESTS.c.id)
    inserted = set(conn.execute(stmt, [record_to_row(record) for record in unique.values()]).scalars())
    fresh = [record for request_id, record in unique.items() if request_id in inserted]
    if fresh:
        apply_rollups(conn, RollupAccumulator().add_all(fresh))
    return StoreResult(inserted=len(fresh), duplicates=len(records) - len(fresh))


def prune_requests(conn: Connection, before: datetime) -> int:
    """Delete request rows created before `before`; returns how many. Rollups are kept, so history stays whole.

    Request rows (prompt text included, where stored) are what grows without bound; this bounds them.
    """
    result = conn.execute(delete(REQUESTS).where(REQUESTS.c.created_at < as_utc(before)))
    return int(result.rowcount or 0)


def iter_records(conn: Connection, chunk_size: int = 10_000) -> Iterable[RequestRecord]:
    """Every stored request as a record, streamed in chunks (for maintenance jobs over the whole table)."""
    # Options on the statement, not the connection: Connection.execution_options changes the connection in place,
    # and a server-side cursor left switched on breaks later executemany calls on it.
    result = conn.execute(select(REQUESTS).execution_options(yield_per=chunk_size))
    for row in result:
        yield row_to_record(row)


def rebuild_rollups(conn: Connection, chunk_size: int = 50_000) -> int:
    """Recompute every rollup table from `requests` (after a bulk import or a change of rollup definitions).

    Runs in the caller's transaction; returns the number of requests counted.
    """
    for model in (HourlyRollup, HourlyTtftBin, HourlyLabelCount):
        conn.execute(delete(table_of(model)))
    accumulator = RollupAccumulator()
    counted = 0
    for record in iter_records(conn, chunk_size):
        accumulator.add(record)
        counted += 1
    apply_rollups(conn, accumulator)
    return counted
