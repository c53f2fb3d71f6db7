"""A database's own engine context: recorded per upstream, the latest one read back (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime

from db.engine import create_sync_engine_for
from db.engine_context import context_from_stats, latest_engine_context, record_engine_context

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
STATS = {"capacity_tokens": 65536, "page_size": 16, "eviction": "lru", "ttl_s": 600, "prefill_tokens_per_s": 2400.5}


def test_the_latest_context_is_read_back_and_an_unmeasured_speed_keeps_the_recorded_one(db_url: str) -> None:
    engine = create_sync_engine_for(db_url)
    try:
        with engine.begin() as conn:
            assert latest_engine_context(conn) is None
            record_engine_context(conn, context_from_stats("engine", STATS, T0))
            later = {**STATS, "prefill_tokens_per_s": None, "capacity_tokens": 131072}
            record_engine_context(conn, context_from_stats("engine", later, T0.replace(hour=10)))
            record_engine_context(conn, context_from_stats("other", {"capacity_tokens": 8}, T0.replace(hour=8)))
        with engine.connect() as conn:
            latest = latest_engine_context(conn)
            other = latest_engine_context(conn, upstream="other")
    finally:
        engine.dispose()
    assert (latest.upstream, latest.recorded_at, latest.capacity_tokens) == ("engine", T0.replace(hour=10), 131072)
    assert (latest.prefill_tokens_per_s, latest.page_size, latest.eviction, latest.ttl_s) == (2400.5, 16, "lru", 600.0)
    assert (other.capacity_tokens, other.prefill_tokens_per_s, other.eviction, other.ttl_s) == (8, None, None, None)


def test_malformed_stats_become_unknown() -> None:
    context = context_from_stats("e", {"capacity_tokens": "lots", "page_size": True, "ttl_s": -1, "eviction": 3}, T0)
    assert (context.capacity_tokens, context.page_size, context.ttl_s, context.eviction) == (None, None, None, None)
