"""Cached tokens by tier and cache load time in `hourly_rollups`, and requests per retention class in
`hourly_label_counts` (dimension `retention`), so the history reads them from the rollups like every other figure.

Both are filled from the existing request rows with the sums `db.rollups` computes (rows pruned before this migration
left no tier split, so their hours count their cached tokens as of unknown tier, which they were).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    ("cached_tokens_device", sa.BigInteger()),
    ("cached_tokens_host", sa.BigInteger()),
    ("cached_tokens_disk", sa.BigInteger()),
    ("requests_with_known_tiers", sa.Integer()),
    ("cache_load_ms_sum", sa.Float()),
    ("cache_load_count", sa.Integer()),
)
_KEY = "bucket_start, tenant, model, upstream"
# A request's tier split counts when every tier and the cached tokens are known and the split fits in the cached
# tokens (`db.rollups.tier_split`).
_SPLIT_KNOWN = (
    "(cached_tokens IS NOT NULL AND cached_tokens_device >= 0 AND cached_tokens_host >= 0 AND cached_tokens_disk >= 0 "
    "AND cached_tokens_device + cached_tokens_host + cached_tokens_disk <= cached_tokens)"
)


def _hour(dialect: str) -> str:
    if dialect == "sqlite":
        # Timestamps are stored as naive UTC text 'YYYY-MM-DD HH:MM:SS.ffffff'; the hour keeps that format.
        return "strftime('%Y-%m-%d %H:00:00.000000', created_at)"
    return "to_timestamp(floor(extract(epoch FROM created_at) / 3600) * 3600)"


def _backfill() -> None:
    """Add the new sums of existing request rows onto their hours' rollup rows, and count their retention classes."""
    if op.get_context().as_sql:
        return  # offline SQL output: nothing to read
    bind = op.get_bind()
    hour = _hour(bind.dialect.name)

    def known(column: str) -> str:
        return f"coalesce(sum(CASE WHEN {_SPLIT_KNOWN} THEN {column} ELSE 0 END), 0)"

    sums = bind.execute(
        sa.text(
            f"SELECT {hour} AS bucket_start, tenant, model, upstream, "
            f"{known('cached_tokens_device')} AS device, {known('cached_tokens_host')} AS host, "
            f"{known('cached_tokens_disk')} AS disk, {known('1')} AS known, "
            "coalesce(sum(cache_load_ms), 0) AS load_ms, count(cache_load_ms) AS loads "
            "FROM requests WHERE cached_tokens_device IS NOT NULL OR cache_load_ms IS NOT NULL "
            f"GROUP BY {hour}, tenant, model, upstream"
        )
    ).mappings().all()
    if sums:
        # The hour comes back in the stored form (text on SQLite, timestamptz on PostgreSQL) and is bound as such.
        bind.execute(
            sa.text(
                "UPDATE hourly_rollups SET cached_tokens_device = :device, cached_tokens_host = :host, "
                "cached_tokens_disk = :disk, requests_with_known_tiers = :known, cache_load_ms_sum = :load_ms, "
                "cache_load_count = :loads WHERE bucket_start = :bucket_start AND tenant = :tenant "
                "AND model = :model AND upstream = :upstream"
            ),
            [dict(row) for row in sums],
        )
    op.execute(
        sa.text(
            f"INSERT INTO hourly_label_counts ({_KEY}, dimension, value, requests) "
            f"SELECT {hour}, tenant, model, upstream, 'retention', retention_class, count(*) FROM requests "
            f"WHERE retention_class IS NOT NULL GROUP BY {hour}, tenant, model, upstream, retention_class"
        )
    )


def upgrade() -> None:
    with op.batch_alter_table("hourly_rollups") as batch:
        for name, type_ in _COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=False, server_default="0"))
    _backfill()


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM hourly_label_counts WHERE dimension = 'retention'"))
    with op.batch_alter_table("hourly_rollups") as batch:
        for name, _ in reversed(_COLUMNS):
            batch.drop_column(name)
