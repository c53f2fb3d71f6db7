"""Shared steps of the retention tests: store generated records and read the advice back; the same records as the
what-if simulator's retention trace."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from db.engine import create_sync_engine_for
from db.queries.retention import retention_advice
from db.records import RequestRecord
from db.retention.advice import TenantRetention
from db.retention.costs import CostModel
from db.simulation.retention import RetentionRequest
from db.store import store_records


def stored_advice(
    db_url: str, records: Sequence[RequestRecord], model: CostModel, since: datetime, until: datetime
) -> TenantRetention:
    """Stores `records` (one tenant's), then reads its retention advice over [since, until) with every upstream
    priced by `model`."""
    engine = create_sync_engine_for(db_url)
    try:
        with engine.begin() as conn:
            store_records(conn, records)
        with engine.connect() as conn:
            (advice,) = retention_advice(conn, since, lambda _: model, until=until)
    finally:
        engine.dispose()
    return advice


def trace_of(records: Sequence[RequestRecord], since: datetime, block: int) -> list[RetentionRequest]:
    """Each record (with a chain) as a request of the retention replay, keyed by its prefix hash; `evicted` when the
    record says it found its prefix evicted (`miss_kind`)."""
    return [
        RetentionRequest((r.created_at - since).total_seconds(), r.prompt_tokens, r.chain.hash_ids, block,
                         r.prefix_hash, r.miss_kind == "evicted")
        for r in records
    ]
