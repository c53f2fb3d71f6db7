"""The replica that served each request, the routing policy, the router's predicted match (tokens) and the index the
prediction came from (`precise` engine cache events, `approximate` what the gateway sent, `none`).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("replica", sa.String(200), nullable=True))
        batch.add_column(sa.Column("routing_policy", sa.String(16), nullable=True))
        batch.add_column(sa.Column("predicted_match_tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("routing_index_source", sa.String(16), nullable=True))
    op.create_index("ix_requests_replica_created_at", "requests", ["replica", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_requests_replica_created_at", table_name="requests")
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("routing_index_source")
        batch.drop_column("predicted_match_tokens")
        batch.drop_column("routing_policy")
        batch.drop_column("replica")
