"""`prompt_signatures`: keyed block hashes of sampled prompts, for the fleet-wide prompt patterns.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UTC_TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "prompt_signatures",
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("created_at", UTC_TIMESTAMP, nullable=False),
        sa.Column("tenant", sa.String(200), nullable=False),
        sa.Column("block_chars", sa.Integer(), nullable=False),
        sa.Column("text_chars", sa.Integer(), nullable=False),
        sa.Column("tool_chars", sa.Integer(), nullable=False),
        sa.Column("prompt_chars", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("head", sa.LargeBinary(), nullable=False),
        sa.Column("tail", sa.LargeBinary(), nullable=False),
        sa.Column("tools", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["request_id"], ["requests.id"], name=op.f("fk_prompt_signatures_request_id_requests"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("request_id", name=op.f("pk_prompt_signatures")),
    )
    op.create_index(op.f("ix_prompt_signatures_created_at"), "prompt_signatures", ["created_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_prompt_signatures_created_at"), table_name="prompt_signatures")
    op.drop_table("prompt_signatures")
