"""Demo data: realistic, seeded, consistent with its rollups."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from db import queries
from db.demo_data import write_demo_data
from db.engine import create_sync_engine_for
from db.records import MISS_KINDS

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def test_demo_data_is_varied_seeded_and_consistent(empty_db_url: str, db_helpers: SimpleNamespace) -> None:
    result = write_demo_data(empty_db_url, rows=3000, seed=3, days=3, now=NOW)
    assert result.rows == 3000 and result.until == NOW
    db_helpers.assert_rollups_match_requests(empty_db_url)
    ids = db_helpers.stored_ids(empty_db_url)
    assert len(ids) == len(set(ids)) == 3000

    engine = create_sync_engine_for(empty_db_url)
    try:
        with engine.connect() as conn:
            overview = queries.overview(conn, NOW - timedelta(days=3), NOW)
            assert overview.requests == 3000
            assert 0.2 < (overview.token_hit_rate or 0) < 0.95
            assert set(overview.miss_kinds) <= set(MISS_KINDS) and len(overview.miss_kinds) >= 4
            assert overview.error_requests > 0 and overview.requests_with_known_cache < 3000
            assert overview.ttft_hit_p50_ms is not None and overview.ttft_miss_p50_ms is not None
            assert overview.ttft_hit_p50_ms < overview.ttft_miss_p50_ms
            assert len(queries.tenants(conn)) == 5 and len(queries.models(conn)) >= 3
            assert queries.rule_counts(conn, NOW - timedelta(days=3), NOW)
            assert queries.top_prefixes(conn, NOW - timedelta(days=3), NOW, limit=5)
            newest = queries.recent_requests(conn, limit=1)[0]
            assert NOW - timedelta(days=3) <= newest.created_at < NOW
    finally:
        engine.dispose()

    # Same seed: the same ids, so writing again adds nothing.
    write_demo_data(empty_db_url, rows=3000, seed=3, days=3, now=NOW)
    assert len(db_helpers.stored_ids(empty_db_url)) == 3000
