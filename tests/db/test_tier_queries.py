"""Cached tokens by tier, cache load time and retention classes in the history queries (SQLite and PostgreSQL), and
migration 0009, which puts them in the rollups and fills them from existing rows. Figures are worked out by hand."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from sqlalchemy import Connection, inspect, text

from db import queries
from db.engine import create_sync_engine_for
from db.migrate import downgrade, upgrade
from db.queries import CachedByTier
from db.records import RequestRecord
from db.store import store_records

T0 = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)  # a Monday
T1 = T0 + timedelta(hours=1)
SINCE, UNTIL = T0 - timedelta(hours=2), T0 + timedelta(hours=3)


def _tiers(device: int | None, host: int | None, disk: int | None) -> dict[str, int | None]:
    return {"cached_tokens_device": device, "cached_tokens_host": host, "cached_tokens_disk": disk}


def _dataset(make_record: Callable[..., RequestRecord]) -> dict[str, RequestRecord]:
    acme = {"tenant": "acme", "model": "m1", "upstream": "local"}
    globex = {"tenant": "globex", "model": "m2", "upstream": "vllm"}
    return {
        # Hour T0: a split over three tiers, a request from an upstream without tiers, a device-only hit.
        "r1": make_record(**acme, created_at=T0 + timedelta(minutes=1), prompt_tokens=1000, cached_tokens=800,
                          **_tiers(500, 200, 100), cache_load_ms=12.5, retention_class="1h"),
        "r2": make_record(**acme, created_at=T0 + timedelta(minutes=2), prompt_tokens=400, cached_tokens=300,
                          retention_class="5m"),
        "r3": make_record(**globex, created_at=T0 + timedelta(minutes=7), prompt_tokens=100, cached_tokens=64,
                          **_tiers(64, 0, 0), cache_load_ms=0.0),
        # Hour T1: all from disk; a failed request; a split larger than the cached count (not trusted: unknown);
        # a split smaller than it (the remainder is unknown).
        "r4": make_record(**acme, created_at=T1 + timedelta(minutes=3), prompt_tokens=1200, cached_tokens=1000,
                          **_tiers(0, 0, 1000), cache_load_ms=40.0, retention_class="persistent"),
        "r5": make_record(**acme, created_at=T1 + timedelta(minutes=4), status_code=502, error_type="bad_gateway",
                          prompt_tokens=None, cached_tokens=None, completion_tokens=None, ttft_ms=None),
        "r6": make_record(**acme, created_at=T1 + timedelta(minutes=5), prompt_tokens=200, cached_tokens=100,
                          **_tiers(80, 40, 0)),
        "r7": make_record(**acme, created_at=T1 + timedelta(minutes=20), prompt_tokens=300, cached_tokens=200,
                          **_tiers(100, 50, 0), retention_class="1h"),
    }


@pytest.fixture
def data(db_url: str, make_record: Callable[..., RequestRecord]) -> dict[str, RequestRecord]:
    records = _dataset(make_record)
    engine = create_sync_engine_for(db_url)
    with engine.begin() as conn:
        # Two transactions' worth, so the rollups are also built by upserting onto existing rows.
        store_records(conn, list(records.values())[:2])
    with engine.begin() as conn:
        store_records(conn, list(records.values())[2:])
    engine.dispose()
    return records


@pytest.fixture
def conn(db_url: str, data: dict[str, RequestRecord]) -> Iterator[Connection]:
    engine = create_sync_engine_for(db_url)
    with engine.connect() as connection:
        yield connection
    engine.dispose()


def test_hourly_series_splits_cached_tokens_by_tier(conn: Connection) -> None:
    first, second = queries.stats(conn, SINCE, UNTIL)
    assert first.bucket_start == T0 and second.bucket_start == T1
    assert first.tiers == CachedByTier(device=564, host=200, disk=100, unknown=300)
    assert first.tiers.total == first.cached_tokens == 1164
    assert (first.requests_with_known_tiers, first.requests_with_known_load) == (2, 2)
    assert first.cache_load_ms_total == pytest.approx(12.5) and first.cache_load_ms_mean == pytest.approx(6.25)
    assert first.requests_by_retention == {"5m": 1, "1h": 1}
    # r6's split (120) exceeds its 100 cached tokens: all 100 unknown; r7 leaves 50 of its 200 without a tier.
    assert second.tiers == CachedByTier(device=100, host=50, disk=1000, unknown=150)
    assert second.tiers.total == second.cached_tokens == 1300
    assert (second.requests_with_known_tiers, second.requests_with_known_load) == (2, 1)
    assert second.cache_load_ms_mean == pytest.approx(40.0)
    assert second.requests_by_retention == {"1h": 1, "persistent": 1}  # shortest class first


def test_overview_and_totals_by_carry_the_range_s_tiers(conn: Connection) -> None:
    overview = queries.overview(conn, SINCE, UNTIL)
    assert overview.tiers == CachedByTier(device=664, host=250, disk=1100, unknown=450)
    assert overview.tiers.total == overview.cached_tokens == 2464
    assert overview.cache_load_ms_total == pytest.approx(52.5)
    assert overview.cache_load_ms_mean == pytest.approx(52.5 / 3)
    assert overview.requests_by_retention == {"5m": 1, "1h": 2, "persistent": 1}
    by_tenant = {row.group: row for row in queries.totals_by(conn, SINCE, UNTIL, quantiles=False)}
    assert by_tenant["acme"].tiers == CachedByTier(device=600, host=250, disk=1100, unknown=450)
    assert by_tenant["globex"].tiers == CachedByTier(device=64)
    assert by_tenant["globex"].requests_by_retention == {} and by_tenant["acme"].requests_by_retention["1h"] == 2
    # Filters apply to the tier figures like to every other one.
    assert queries.overview(conn, SINCE, UNTIL, model="m2").tiers == CachedByTier(device=64)
    acme_first = queries.stats(conn, SINCE, UNTIL, tenant="acme")[0]
    assert acme_first.tiers == CachedByTier(device=500, host=200, disk=100, unknown=300)
    empty = queries.overview(conn, T0 + timedelta(days=30), T0 + timedelta(days=31))
    assert empty.tiers == CachedByTier() and empty.cache_load_ms_mean is None and empty.requests_by_retention == {}


def test_minute_and_daily_buckets_agree_with_the_hours(conn: Connection) -> None:
    hourly = queries.stats(conn, SINCE, UNTIL)
    per_5m = queries.stats(conn, SINCE, UNTIL, bucket="5m")
    assert [(row.bucket_start - T0, row.tiers.known) for row in per_5m] == [
        (timedelta(minutes=0), 800),  # r1 (r2 has no tiers)
        (timedelta(minutes=5), 64),  # r3
        (timedelta(minutes=60), 1000),  # r4 (r5 failed)
        (timedelta(minutes=65), 0),  # r6, untrusted
        (timedelta(minutes=80), 150),  # r7
    ]
    for rows in (per_5m, queries.stats(conn, SINCE, UNTIL, bucket="1d")):
        folded = queries.tier_totals(rows)
        assert folded == queries.tier_totals(hourly)
    grouped = queries.stats(conn, SINCE, UNTIL, bucket="1m", group_by="tenant")
    assert queries.tier_totals(grouped).tiers == queries.overview(conn, SINCE, UNTIL).tiers


def test_tier_totals_fold_a_series_exactly(conn: Connection) -> None:
    totals = queries.tier_totals(queries.stats(conn, SINCE, UNTIL, group_by="model"))
    overview = queries.overview(conn, SINCE, UNTIL)
    assert (totals.requests, totals.cached_tokens, totals.tiers) == (7, 2464, overview.tiers)
    assert totals.requests_with_known_tiers == 4 and totals.requests_with_known_load == 3
    # A mean of the load time per request that reported it, not a mean of the buckets' means.
    assert totals.cache_load_ms_mean == pytest.approx(52.5 / 3)
    assert totals.requests_by_retention == {"5m": 1, "1h": 2, "persistent": 1}
    assert totals.requests_without_retention == 3
    assert queries.tier_totals([]) == queries.TierTotals()


def test_incremental_rollups_equal_a_rebuild(db_url: str, data: dict[str, RequestRecord],
                                             db_helpers: SimpleNamespace) -> None:
    db_helpers.assert_rollups_match_requests(db_url)


def _tier_rollups(url: str) -> list[tuple[object, ...]]:
    """The tier columns of every hourly rollup and every retention label row, sorted."""
    engine = create_sync_engine_for(url)
    try:
        with engine.connect() as conn:
            rollups = conn.execute(text(
                "SELECT tenant, model, cached_tokens_device, cached_tokens_host, cached_tokens_disk, "
                "requests_with_known_tiers, cache_load_ms_sum, cache_load_count FROM hourly_rollups"
            ))
            labels = conn.execute(text(
                "SELECT tenant, model, value, requests FROM hourly_label_counts WHERE dimension = 'retention'"
            ))
            return sorted(tuple(row) for row in rollups) + sorted(("label", *row) for row in labels)
    finally:
        engine.dispose()


def test_0009_backfills_what_the_writer_computes_and_downgrades(
    db_url: str, data: dict[str, RequestRecord]
) -> None:
    written = _tier_rollups(db_url)
    assert ("acme", "m1", 500, 200, 100, 1, 12.5, 1) in written  # hour T0
    assert ("acme", "m1", 100, 50, 1000, 2, 40.0, 1) in written  # hour T1
    assert ("label", "acme", "m1", "1h", 1) in written
    downgrade(db_url, "0008")
    engine = create_sync_engine_for(db_url)
    try:
        columns = {column["name"] for column in inspect(engine).get_columns("hourly_rollups")}
        assert "cached_tokens_device" not in columns and "cached_tokens" in columns
        with engine.connect() as conn:
            retention_labels = "SELECT count(*) FROM hourly_label_counts WHERE dimension = 'retention'"
            assert conn.execute(text(retention_labels)).scalar() == 0
            assert conn.execute(text("SELECT count(*) FROM requests")).scalar() == 7
    finally:
        engine.dispose()
    upgrade(db_url)
    # Filled from the request rows with the writer's arithmetic (r6's untrusted split included).
    assert _tier_rollups(db_url) == written
    engine = create_sync_engine_for(db_url)
    try:
        with engine.connect() as conn:
            assert queries.overview(conn, SINCE, UNTIL).tiers == CachedByTier(664, 250, 1100, 450)
    finally:
        engine.dispose()
