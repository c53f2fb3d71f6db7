"""The provider's own prompt-cache diagnosis beside prefixscope's: its reason as the provider names it and the input
tokens it says missed (OpenAI's `prompt_cache_diagnostics`, Anthropic's `diagnostics.cache_miss_reason`); NULL when
the upstream returned none.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("provider_miss_reason", sa.String(48), nullable=True))
        batch.add_column(sa.Column("provider_missed_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("provider_missed_tokens")
        batch.drop_column("provider_miss_reason")
