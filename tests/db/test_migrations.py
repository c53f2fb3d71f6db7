"""Migrations are the only way the schema is made: up to head and back to base, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from db.config import async_url
from db.engine import create_sync_engine_for
from db.migrate import current_revision, downgrade, head_revision, is_current, upgrade
from db.models import Base

TABLES = {"tenants", "api_keys", "requests", "hourly_rollups", "hourly_ttft_bins", "hourly_label_counts"}


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
        rollup_key = inspector.get_pk_constraint("hourly_rollups")["constrained_columns"]
        assert rollup_key == ["bucket_start", "tenant", "model", "upstream"]
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
