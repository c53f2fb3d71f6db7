"""Initial schema: tenants, API keys, requests and the hourly rollups.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out here rather than imported from db.types, so this revision keeps meaning what it meant when written.
# db.types.UTCDateTime stores into DateTime(timezone=True); the JSON variant matches db.types.portable_json.
UTC_TIMESTAMP = sa.DateTime(timezone=True)


def _json() -> sa.types.TypeEngine[Any]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _rollup_key_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("bucket_start", UTC_TIMESTAMP, nullable=False),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("upstream", sa.String(200), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("created_at", UTC_TIMESTAMP, nullable=False),
        sa.Column("settings", _json(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("secret_hash", sa.String(128), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("label", sa.String(200), nullable=True),
        sa.Column("created_at", UTC_TIMESTAMP, nullable=False),
        sa.Column("revoked_at", UTC_TIMESTAMP, nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_api_keys_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_id", name=op.f("uq_api_keys_key_id")),
    )
    op.create_index(op.f("ix_api_keys_tenant_id"), "api_keys", ["tenant_id"])

    op.create_table(
        "requests",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("created_at", UTC_TIMESTAMP, nullable=False),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("endpoint", sa.String(32), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("upstream", sa.String(200), nullable=False),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("status_code", sa.SmallInteger(), nullable=False),
        sa.Column("error_type", sa.String(100), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("cached_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("applied_rules", _json(), nullable=False),
        sa.Column("miss_kind", sa.String(16), nullable=True),
        sa.Column("prefix_hash", sa.String(128), nullable=True),
        sa.Column("diverged_at_token", sa.Integer(), nullable=True),
        sa.Column("prompt_text", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_requests")),
    )
    op.create_index(op.f("ix_requests_created_at"), "requests", ["created_at"])
    op.create_index("ix_requests_tenant_created_at", "requests", ["tenant", "created_at"])
    op.create_index("ix_requests_model_created_at", "requests", ["model", "created_at"])
    op.create_index("ix_requests_miss_kind_created_at", "requests", ["miss_kind", "created_at"])
    op.create_index("ix_requests_prefix_hash_created_at", "requests", ["prefix_hash", "created_at"])

    op.create_table(
        "hourly_rollups",
        *_rollup_key_columns(),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("error_requests", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cache_known_prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cache_known_cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("requests_with_known_cache", sa.Integer(), nullable=False),
        sa.Column("requests_with_hit", sa.Integer(), nullable=False),
        sa.Column("latency_ms_sum", sa.Float(), nullable=False),
        sa.Column("ttft_hit_ms_sum", sa.Float(), nullable=False),
        sa.Column("ttft_hit_count", sa.Integer(), nullable=False),
        sa.Column("ttft_miss_ms_sum", sa.Float(), nullable=False),
        sa.Column("ttft_miss_count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("bucket_start", "tenant", "model", "upstream", name=op.f("pk_hourly_rollups")),
    )
    op.create_index("ix_hourly_rollups_tenant_bucket_start", "hourly_rollups", ["tenant", "bucket_start"])
    op.create_index("ix_hourly_rollups_model_bucket_start", "hourly_rollups", ["model", "bucket_start"])

    op.create_table(
        "hourly_ttft_bins",
        *_rollup_key_columns(),
        sa.Column("cache_state", sa.String(8), nullable=False),
        sa.Column("bin", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint(
            "bucket_start", "tenant", "model", "upstream", "cache_state", "bin", name=op.f("pk_hourly_ttft_bins")
        ),
    )

    op.create_table(
        "hourly_label_counts",
        *_rollup_key_columns(),
        sa.Column("dimension", sa.String(16), nullable=False),
        sa.Column("value", sa.String(100), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint(
            "bucket_start", "tenant", "model", "upstream", "dimension", "value", name=op.f("pk_hourly_label_counts")
        ),
    )
    op.create_index(
        "ix_hourly_label_counts_dimension_bucket_start", "hourly_label_counts", ["dimension", "bucket_start"]
    )


def downgrade() -> None:
    op.drop_table("hourly_label_counts")
    op.drop_table("hourly_ttft_bins")
    op.drop_table("hourly_rollups")
    op.drop_table("requests")
    op.drop_table("api_keys")
    op.drop_table("tenants")
