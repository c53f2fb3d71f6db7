"""Cache writes and the retention class on requests, for the Anthropic Messages API (`endpoint = 'messages'`).

`cache_write_tokens` holds the prompt tokens a request wrote to the cache (`cache_creation_input_tokens`);
`retention_class` the longest lifetime (`5m` or `1h`) its `cache_control` breakpoints asked for. Both are NULL on
existing rows and on chat and completions requests. The endpoint column is a free string, so `messages` needs no
schema change.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("cache_write_tokens", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("retention_class", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("retention_class")
        batch.drop_column("cache_write_tokens")
