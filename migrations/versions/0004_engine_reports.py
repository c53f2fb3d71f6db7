"""What the engine reports with each match, kept with the request: where TTFT came from, how the divergence was
located, the template's fixed opening (a hit reuses more than it); per TTFT histogram bin, the smallest and largest
TTFT seen (quantiles are clamped to them); `namespace_tenants`, the tenant of each engine cache namespace label;
`engine_contexts`, the prefill speed and cache settings of the engines the history was recorded on.

Existing rows keep NULL in every new column: their source is unknown, their opening counts as 0 and their bins fall
back to the bin edges.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_REQUEST_COLUMNS = (
    ("ttft_source", sa.String(16)),
    ("divergence_source", sa.String(16)),
    ("template_tokens", sa.Integer()),
)
_BIN_COLUMNS = (("ttft_min_ms", sa.Float()), ("ttft_max_ms", sa.Float()))


def upgrade() -> None:
    op.create_table(
        "namespace_tenants",
        sa.Column("namespace_label", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("namespace_label", name="pk_namespace_tenants"),
    )
    op.create_table(
        "engine_contexts",
        sa.Column("upstream", sa.String(200), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("prefill_tokens_per_s", sa.Float(), nullable=True),
        sa.Column("capacity_tokens", sa.BigInteger(), nullable=True),
        sa.Column("page_size", sa.Integer(), nullable=True),
        sa.Column("eviction", sa.String(32), nullable=True),
        sa.Column("ttl_s", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("upstream", name="pk_engine_contexts"),
    )
    with op.batch_alter_table("requests") as batch:
        for name, type_ in _REQUEST_COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))
    with op.batch_alter_table("hourly_ttft_bins") as batch:
        for name, type_ in _BIN_COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hourly_ttft_bins") as batch:
        for name, _ in reversed(_BIN_COLUMNS):
            batch.drop_column(name)
    with op.batch_alter_table("requests") as batch:
        for name, _ in reversed(_REQUEST_COLUMNS):
            batch.drop_column(name)
    op.drop_table("engine_contexts")
    op.drop_table("namespace_tenants")
