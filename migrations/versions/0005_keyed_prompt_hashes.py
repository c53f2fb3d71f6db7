"""`requests.hash_key_version`: how the stored prompt hashes (prefix_hash, the hash chain) of a row are keyed.

Rows stored before this revision keep their plain hashes and read NULL: they stay queryable and group among
themselves, never with keyed hashes. Rows the gateway stores from now on carry 1: keyed BLAKE2b under a per-tenant
key derived from the gateway's server secret, so the database alone reveals nothing about the prompts.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("hash_key_version", sa.SmallInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("hash_key_version")
