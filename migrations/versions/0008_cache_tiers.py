"""Cached tokens by the tier that served them (device pool, host memory, disk) and the engine's load time (ms);
NULL = unknown, for upstreams that do not report tiers.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("cached_tokens_device", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("cached_tokens_host", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("cached_tokens_disk", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("cache_load_ms", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("cache_load_ms")
        batch.drop_column("cached_tokens_disk")
        batch.drop_column("cached_tokens_host")
        batch.drop_column("cached_tokens_device")
