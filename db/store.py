"""Writing request records: `requests` rows, their hash chains and their rollups in one transaction, idempotent by
request id.

These are sync functions on a `Connection`; the async writer runs them with `AsyncConnection.run_sync`, the demo
data generator and maintenance commands call them directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, select

from db.advice_store import store_advice
from db.signature_store import SIGNATURES, store_signatures
from db.chains import RequestChain, unpack_hash_ids
from db.dialect import greatest, upsert_insert
from db.models import NamespaceTenant, RequestChainRow, RequestRecordRow, table_of
from db.record_schema import StoredField, stored_fields
from db.records import RequestRecord
from db.rollups import ROLLUP_MODELS, RollupAccumulator, apply_rollups
from db.storable import storable_record
from db.timeutil import as_utc

REQUESTS = table_of(RequestRecordRow)
CHAINS = table_of(RequestChainRow)
NAMESPACES = table_of(NamespaceTenant)


@dataclass(frozen=True)
class StoreResult:
    """What `store_records` did: rows inserted, and records skipped because their id was already stored."""

    inserted: int
    duplicates: int


def record_to_row(record: RequestRecord) -> dict[str, Any]:
    """The `requests` row (column name to value) for a record: one column per stored field (`db.record_schema`)."""
    row: dict[str, Any] = {}
    for item in stored_fields(RequestRecord):
        value = getattr(record, item.name)
        if item.stored.kind == "json":
            value = list(value)
        elif item.stored.cut and value is not None:
            value = value[: item.stored.max_chars]  # a label is cut to its column rather than refused
        row[item.column] = value
    return row


def chain_to_row(record: RequestRecord, chain: RequestChain) -> dict[str, Any]:
    """The `request_chains` row for a record's chain."""
    return {
        "request_id": record.request_id,
        "created_at": record.created_at,
        "tenant": record.tenant,
        "block_size": chain.block_size,
        "input_length": chain.input_length,
        "approximate": chain.approximate,
        "hash_ids": chain.packed_hash_ids(),
    }


def row_to_chain(row: Any) -> RequestChain:
    """A `RequestChain` from a `request_chains` row."""
    return RequestChain(
        block_size=row.block_size,
        input_length=row.input_length,
        hash_ids=unpack_hash_ids(bytes(row.hash_ids)),
        approximate=bool(row.approximate),
    )


def row_to_record(row: Any, chain: RequestChain | None = None) -> RequestRecord:
    """A `RequestRecord` from a `requests` row (ORM object or a result row with the column names) and its chain.
    A column the row lacks (a row read under an older schema) takes the field's default."""
    return RequestRecord(chain=chain, **row_values(row, stored_fields(RequestRecord)))


def row_values(row: Any, columns: Iterable[StoredField]) -> dict[str, Any]:
    """Field name -> value of `columns` read from a `requests` row, as the record holds them (a tuple of rules, a
    bool for `stream`)."""
    values: dict[str, Any] = {}
    for item in columns:
        value = getattr(row, item.column) if item.required else getattr(row, item.column, item.default)
        if item.stored.kind == "json":
            value = tuple(value or ())
        elif item.stored.kind == "bool" and value is not None:
            value = bool(value)
        values[item.name] = value
    return values


def store_records(conn: Connection, records: Sequence[RequestRecord]) -> StoreResult:
    """Insert the records (and the chains of those that carry one) and add them to the rollups, in the caller's
    transaction.

    Records whose id is already stored (or repeated within `records`) are skipped and left out of the rollups, so
    storing the same record twice (a replayed spill file after a commit whose acknowledgement was lost) never
    double counts. The insert itself reports which rows it added (`ON CONFLICT DO NOTHING RETURNING id`), which
    holds even when another writer stores the same id at the same moment.
    """
    unique: dict[str, RequestRecord] = {}
    for record in records:
        unique.setdefault(record.request_id, storable_record(record))
    if not unique:
        return StoreResult(inserted=0, duplicates=len(records))
    stmt = upsert_insert(conn, REQUESTS).on_conflict_do_nothing(index_elements=["id"]).returning(REQUESTS.c.id)
    inserted = set(conn.execute(stmt, [record_to_row(record) for record in unique.values()]).scalars())
    fresh = [record for request_id, record in unique.items() if request_id in inserted]
    chains = [chain_to_row(record, record.chain) for record in fresh if record.chain is not None]
    if chains:
        conn.execute(upsert_insert(conn, CHAINS).on_conflict_do_nothing(index_elements=["request_id"]), chains)
    if fresh:
        apply_rollups(conn, RollupAccumulator().add_all(fresh))
        store_advice(conn, fresh)
        store_signatures(conn, fresh)
        _record_namespaces(conn, fresh)
    return StoreResult(inserted=len(fresh), duplicates=len(records) - len(fresh))


def _record_namespaces(conn: Connection, records: Sequence[RequestRecord]) -> None:
    """Upsert namespace label -> tenant (the latest request wins; labels are derived from the tenant, so they agree)."""
    latest: dict[str, RequestRecord] = {}
    for record in records:
        label = record.namespace_label
        if label is not None and (label not in latest or record.created_at > latest[label].created_at):
            latest[label] = record
    if not latest:
        return
    rows = [
        {"namespace_label": label[:64], "tenant": record.tenant, "last_seen": record.created_at}
        for label, record in sorted(latest.items())
    ]
    stmt = upsert_insert(conn, NAMESPACES)
    update = {
        "tenant": stmt.excluded.tenant,
        "last_seen": greatest(conn, NAMESPACES.c.last_seen, stmt.excluded.last_seen),
    }
    conn.execute(stmt.on_conflict_do_update(index_elements=["namespace_label"], set_=update), rows)


def prune_requests(conn: Connection, before: datetime) -> int:
    """Delete request rows (and their chains) created before `before`; returns how many requests. Rollups are kept,
    so history stays whole.

    Request rows (prompt text included, where stored) and chains are what grows without bound; this bounds them.
    """
    # Explicitly rather than by the foreign key's cascade, which SQLite applies only with foreign keys switched on.
    conn.execute(delete(CHAINS).where(CHAINS.c.created_at < as_utc(before)))
    conn.execute(delete(SIGNATURES).where(SIGNATURES.c.created_at < as_utc(before)))
    result = conn.execute(delete(REQUESTS).where(REQUESTS.c.created_at < as_utc(before)))
    return int(result.rowcount or 0)


def iter_records(conn: Connection, chunk_size: int = 10_000) -> Iterable[RequestRecord]:
    """Every stored request as a record (without its chain), streamed in chunks (for maintenance jobs over the whole
    table)."""
    # Options on the statement, not the connection: Connection.execution_options changes the connection in place,
    # and a server-side cursor left switched on breaks later executemany calls on it.
    result = conn.execute(select(REQUESTS).execution_options(yield_per=chunk_size))
    for row in result:
        yield row_to_record(row)


def rebuild_rollups(conn: Connection, chunk_size: int = 50_000) -> int:
    """Recompute every rollup table from `requests` (after a bulk import or a change of rollup definitions).

    Runs in the caller's transaction; returns the number of requests counted.
    """
    for model in ROLLUP_MODELS:
        conn.execute(delete(table_of(model)))
    accumulator = RollupAccumulator()
    counted = 0
    for record in iter_records(conn, chunk_size):
        accumulator.add(record)
        counted += 1
    apply_rollups(conn, accumulator)
    return counted
