"""Migrations are the only way the schema is made: up to head and back to base, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import bindparam, inspect, select, text

from db.config import async_url
from db.engine import create_sync_engine_for
from db.migrate import current_revision, downgrade, head_revision, is_current, upgrade
from db.models import Base, HourlyPrefixRollup, table_of
from db.store import rebuild_rollups
from db.types import UTCDateTime

TABLES_0001 = {"tenants", "api_keys", "requests", "hourly_rollups", "hourly_ttft_bins", "hourly_label_counts"}
TABLES = TABLES_0001 | {"request_chains", "hourly_prefix_rollups", "hourly_miss_reasons", "hourly_divergences"} | {
    "namespace_tenants",
    "engine_contexts",
}
TABLES |= {"hourly_advice"}  # 0003
TABLES |= {"prompt_signatures"}  # 0010


def _tables(url: str) -> set[str]:
    engine = create_sync_engine_for(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_to_head_and_downgrade_to_base(empty_db_url: str) -> None:
    assert current_revision(empty_db_url) is None
    assert not is_current(empty_db_url)
    upgrade(empty_db_url)
    assert current_revision(empty_db_url) == head_revision()
    assert is_current(empty_db_url)
    assert _tables(empty_db_url) == TABLES
    upgrade(empty_db_url)  # idempotent
    downgrade(empty_db_url, "base")
    assert current_revision(empty_db_url) is None
    assert _tables(empty_db_url) == set()
    upgrade(empty_db_url)
    assert _tables(empty_db_url) == TABLES


def test_async_urls_are_accepted(empty_db_url: str) -> None:
    upgrade(async_url(empty_db_url))
    assert current_revision(async_url(empty_db_url)) == head_revision()


def test_migrated_schema_matches_the_models(db_url: str) -> None:
    engine = create_sync_engine_for(db_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_indexes_for_history_queries_exist(db_url: str) -> None:
    engine = create_sync_engine_for(db_url)
    try:
        inspector = inspect(engine)
        request_indexes = {tuple(index["column_names"]) for index in inspector.get_indexes("requests")}
        assert {("created_at",), ("tenant", "created_at"), ("model", "created_at")} <= request_indexes
        assert {("miss_reason", "created_at"), ("prefix_hash", "created_at")} <= request_indexes
        rollup_key = inspector.get_pk_constraint("hourly_rollups")["constrained_columns"]
        assert rollup_key == ["bucket_start", "tenant", "model", "upstream"]
        prefix_key = inspector.get_pk_constraint("hourly_prefix_rollups")["constrained_columns"]
        assert prefix_key == ["bucket_start", "tenant", "prefix_hash"]
        chain_indexes = {tuple(index["column_names"]) for index in inspector.get_indexes("request_chains")}
        assert {("created_at",), ("tenant", "created_at")} <= chain_indexes
    finally:
        engine.dispose()


def test_sqlite_connections_use_wal(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'wal.db'}"
    upgrade(url)
    engine = create_sync_engine_for(url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() > 0
            assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
    finally:
        engine.dispose()


_REQUEST_0001 = (
    "INSERT INTO requests (id, created_at, tenant, key_id, endpoint, model, upstream, stream, status_code, "
    "error_type, prompt_tokens, cached_tokens, completion_tokens, ttft_ms, latency_ms, applied_rules, miss_kind, "
    "prefix_hash, diverged_at_token, prompt_text) VALUES (:id, :created_at, 'acme', NULL, 'chat.completions', 'm1', "
    "'local', false, 200, NULL, :prompt, :cached, 5, 10.0, 20.0, '[]', NULL, :prefix, NULL, NULL)"
)


def test_0002_backfills_prefix_rollups_from_existing_rows_and_downgrades(
    empty_db_url: str, db_helpers: SimpleNamespace
) -> None:
    upgrade(empty_db_url, "0001")
    assert _tables(empty_db_url) == TABLES_0001
    base = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)
    rows = [
        {"id": "a", "created_at": base + timedelta(minutes=5), "prompt": 100, "cached": 64, "prefix": "p1"},
        {"id": "b", "created_at": base + timedelta(minutes=50), "prompt": 200, "cached": 0, "prefix": "p1"},
        {"id": "c", "created_at": base + timedelta(minutes=70), "prompt": None, "cached": None, "prefix": "p1"},
        {"id": "d", "created_at": base + timedelta(minutes=10), "prompt": 300, "cached": 16, "prefix": None},
    ]
    engine = create_sync_engine_for(empty_db_url)
    try:
        with engine.begin() as conn:
            # Bound through the model's column types, so timestamps are stored the way the writer stores them.
            statement = text(_REQUEST_0001).bindparams(bindparam("created_at", type_=UTCDateTime()))
            conn.execute(statement, rows)
        upgrade(empty_db_url)
        assert _tables(empty_db_url) == TABLES
        with engine.connect() as conn:
            backfilled = sorted(
                (row.bucket_start, row.prefix_hash, row.requests, row.requests_with_hit, row.prompt_tokens)
                + (row.cached_tokens, row.first_seen, row.last_seen)
                for row in conn.execute(select(table_of(HourlyPrefixRollup)))
            )
        assert backfilled == [
            (base, "p1", 2, 1, 300, 64, base + timedelta(minutes=5), base + timedelta(minutes=50)),
            (base + timedelta(hours=1), "p1", 1, 0, 0, 0, base + timedelta(minutes=70), base + timedelta(minutes=70)),
        ]

        # The backfill equals what the writer's rollups compute from the same rows (the raw inserts above made no
        # other rollups, so only the prefix table compares).
        def prefix_rows() -> list[tuple[object, ...]]:
            return [row for row in db_helpers.rollup_snapshot(empty_db_url) if row[0] == "hourly_prefix_rollups"]

        before = prefix_rows()
        with engine.begin() as conn:
            rebuild_rollups(conn)
        assert prefix_rows() == before
        downgrade(empty_db_url, "0001")
        assert _tables(empty_db_url) == TABLES_0001
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM requests")).scalar() == 4
        columns = {column["name"] for column in inspect(engine).get_columns("requests")}
        assert "miss_reason" not in columns and "prefix_hash" in columns
    finally:
        engine.dispose()


def test_0005_keeps_rows_with_plain_hashes_readable_and_downgrades(empty_db_url: str) -> None:
    """Rows stored before keyed hashes keep their prefix_hash and read hash_key_version NULL."""
    upgrade(empty_db_url, "0002")
    engine = create_sync_engine_for(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO requests (id, created_at, tenant, endpoint, model, upstream, stream, status_code, "
                    "latency_ms, applied_rules, prefix_hash) VALUES ('legacy', :at, 'acme', 'chat.completions', 'm', "
                    "'local', false, 200, 1.0, '[]', '00112233aabbccdd')"
                ),
                {"at": datetime(2026, 1, 1, tzinfo=UTC)},
            )
        upgrade(empty_db_url)
        with engine.connect() as conn:
            row = conn.execute(text("SELECT prefix_hash, hash_key_version FROM requests WHERE id = 'legacy'")).one()
        assert tuple(row) == ("00112233aabbccdd", None)
        downgrade(empty_db_url, "0002")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT prefix_hash FROM requests")).scalar_one() == "00112233aabbccdd"
    finally:
        engine.dispose()
