"""Conversations and the token ledger: each request's conversation (keyed id, where the id came from, turn index,
parent request, idle time), how the client re-sent the previous answer, and its prompt tokens split into new, lost by
cause and unknown (`db.ledger`); the ledger's sums in `hourly_rollups`.

Rows from before have no ledger (NULL): the history shows their ledger parts as unknown rather than guessing.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copy of `db.ledger.LOST_CAUSES` as of this revision (a migration must not change when the code does).
_CAUSES = (
    "system_changed",
    "tools_changed",
    "messages_changed",
    "answer_rewritten",
    "reordered",
    "volatile_value",
    "model_changed",
    "evicted",
    "expired",
    "routed_away",
    "page_alignment",
    "cache_scope",
)
_REQUEST_COLUMNS = (
    ("conversation_id", sa.String(64)),
    ("conversation_source", sa.String(16)),
    ("turn_index", sa.Integer()),
    ("parent_request_id", sa.String(64)),
    ("idle_s", sa.Float()),
    ("answer_rewrite", sa.String(24)),
    ("answer_rewrite_segment", sa.String(100)),
    ("answer_rewrite_char_offset", sa.Integer()),
    ("new_tokens", sa.Integer()),
    *((f"lost_{cause}_tokens", sa.Integer()) for cause in _CAUSES),
    ("unknown_tokens", sa.Integer()),
    ("evicted_tier", sa.String(16)),
)
_ROLLUP_COLUMNS = (
    "ledger_prompt_tokens",
    "ledger_cached_tokens",
    "new_tokens",
    "unknown_tokens",
    *(f"lost_{cause}_tokens" for cause in _CAUSES),
)


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        for name, kind in _REQUEST_COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))
    op.create_index("ix_requests_tenant_conversation_id", "requests", ["tenant", "conversation_id"])
    with op.batch_alter_table("hourly_rollups") as batch:
        for name in _ROLLUP_COLUMNS:
            batch.add_column(sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("hourly_rollups") as batch:
        for name in reversed(_ROLLUP_COLUMNS):
            batch.drop_column(name)
    op.drop_index("ix_requests_tenant_conversation_id", table_name="requests")
    with op.batch_alter_table("requests") as batch:
        for name, _ in reversed(_REQUEST_COLUMNS):
            batch.drop_column(name)
