"""The rule advisor's hourly rollup: per tenant, settings fingerprint and candidate rule, sampled requests with their
actual and estimated prompt and cached tokens.

Starts empty: the estimates are made by a running gateway.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "hourly_advice",
        sa.Column("bucket_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("settings_fingerprint", sa.String(16), nullable=False),
        sa.Column("candidate", sa.String(64), nullable=False),
        sa.Column("last_sample_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("changed_samples", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("candidate_prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("candidate_cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("ttft_ms_sum", sa.Float(), nullable=False),
        sa.Column("ttft_prefilled_tokens", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "bucket_start", "tenant", "settings_fingerprint", "candidate", name=op.f("pk_hourly_advice")
        ),
    )


def downgrade() -> None:
    op.drop_table("hourly_advice")
