"""Miss reasons and divergence locations on requests, request hash chains, and the per-tenant hourly rollups of
prefix reuse, miss reasons and divergence locations; normalization gain sums on `hourly_rollups`.

The prefix rollup is filled from the existing request rows; the other new rollups start empty, since no existing row
has a miss reason, a divergence location or a measured normalization gain.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UTC_TIMESTAMP = sa.DateTime(timezone=True)
_NORMALIZATION_COLUMNS = (
    ("normalization_sampled_requests", sa.Integer()),
    ("normalization_requests_with_gain", sa.Integer()),
    ("normalization_gain_tokens", sa.BigInteger()),
    ("normalization_prompt_tokens", sa.BigInteger()),
)
_STORED_PROMPT = sa.text("prompt_text IS NOT NULL")


def _hour_key_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("bucket_start", UTC_TIMESTAMP, nullable=False),
        sa.Column("tenant", sa.String(200), nullable=False),
    ]


def _add_request_columns() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("miss_reason", sa.String(32), nullable=True))
        batch.add_column(sa.Column("divergence_segment", sa.String(100), nullable=True))
        batch.add_column(sa.Column("divergence_char_offset", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("recomputed_tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("normalization_gain_tokens", sa.Integer(), nullable=True))
    op.create_index("ix_requests_miss_reason_created_at", "requests", ["miss_reason", "created_at"])
    op.create_index(
        "ix_requests_prefix_hash_stored_prompt",
        "requests",
        ["prefix_hash", "created_at"],
        sqlite_where=_STORED_PROMPT,
        postgresql_where=_STORED_PROMPT,
    )
    with op.batch_alter_table("hourly_rollups") as batch:
        for name, type_ in _NORMALIZATION_COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=False, server_default="0"))


def _create_rollup_tables() -> None:
    op.create_table(
        "hourly_prefix_rollups",
        *_hour_key_columns(),
        sa.Column("prefix_hash", sa.String(128), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("requests_with_hit", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("first_seen", UTC_TIMESTAMP, nullable=False),
        sa.Column("last_seen", UTC_TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("bucket_start", "tenant", "prefix_hash", name=op.f("pk_hourly_prefix_rollups")),
    )
    op.create_index("ix_hourly_prefix_rollups_tenant_bucket_start", "hourly_prefix_rollups", ["tenant", "bucket_start"])
    op.create_table(
        "hourly_miss_reasons",
        *_hour_key_columns(),
        sa.Column("miss_reason", sa.String(32), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("recomputed_tokens", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("bucket_start", "tenant", "miss_reason", name=op.f("pk_hourly_miss_reasons")),
    )
    op.create_table(
        "hourly_divergences",
        *_hour_key_columns(),
        sa.Column("segment", sa.String(100), nullable=False),
        sa.Column("offset_bucket", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("recomputed_tokens", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "bucket_start", "tenant", "segment", "offset_bucket", name=op.f("pk_hourly_divergences")
        ),
    )


def _create_request_chains() -> None:
    op.create_table(
        "request_chains",
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("created_at", UTC_TIMESTAMP, nullable=False),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("block_size", sa.Integer(), nullable=False),
        sa.Column("input_length", sa.Integer(), nullable=False),
        sa.Column("approximate", sa.Boolean(), nullable=False),
        sa.Column("hash_ids", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["request_id"], ["requests.id"], name=op.f("fk_request_chains_request_id_requests"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("request_id", name=op.f("pk_request_chains")),
    )
    op.create_index(op.f("ix_request_chains_created_at"), "request_chains", ["created_at"])
    op.create_index("ix_request_chains_tenant_created_at", "request_chains", ["tenant", "created_at"])


def _backfill_prefix_rollups() -> None:
    """Fill `hourly_prefix_rollups` from the request rows, with the same sums as `db.rollups` computes."""
    if op.get_context().as_sql:
        return  # offline SQL output: nothing to read
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        # Timestamps are stored as naive UTC text 'YYYY-MM-DD HH:MM:SS.ffffff'; the hour keeps that format.
        hour = "strftime('%Y-%m-%d %H:00:00.000000', created_at)"
    else:
        hour = "to_timestamp(floor(extract(epoch FROM created_at) / 3600) * 3600)"
    op.execute(
        sa.text(
            "INSERT INTO hourly_prefix_rollups (bucket_start, tenant, prefix_hash, requests, requests_with_hit, "
            "prompt_tokens, cached_tokens, first_seen, last_seen) "
            f"SELECT {hour}, tenant, prefix_hash, count(*), "
            "sum(CASE WHEN cached_tokens > 0 THEN 1 ELSE 0 END), "
            "coalesce(sum(prompt_tokens), 0), coalesce(sum(cached_tokens), 0), min(created_at), max(created_at) "
            f"FROM requests WHERE prefix_hash IS NOT NULL GROUP BY {hour}, tenant, prefix_hash"
        )
    )


def upgrade() -> None:
    _add_request_columns()
    _create_rollup_tables()
    _create_request_chains()
    _backfill_prefix_rollups()


def downgrade() -> None:
    op.drop_table("request_chains")
    op.drop_table("hourly_divergences")
    op.drop_table("hourly_miss_reasons")
    op.drop_table("hourly_prefix_rollups")
    with op.batch_alter_table("hourly_rollups") as batch:
        for name, _ in reversed(_NORMALIZATION_COLUMNS):
            batch.drop_column(name)
    op.drop_index("ix_requests_prefix_hash_stored_prompt", table_name="requests")
    op.drop_index("ix_requests_miss_reason_created_at", table_name="requests")
    with op.batch_alter_table("requests") as batch:
        for name in (
            "normalization_gain_tokens",
            "recomputed_tokens",
            "divergence_char_offset",
            "divergence_segment",
            "miss_reason",
        ):
            batch.drop_column(name)
