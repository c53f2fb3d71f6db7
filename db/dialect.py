"""Dialect-specific statement builders, kept in one place."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Table
from sqlalchemy.dialects import postgresql, sqlite


def upsert_insert(conn: Connection, table: Table) -> Any:
    """An INSERT for `table` that supports `on_conflict_do_update/_nothing` on this connection's dialect."""
    name = conn.dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise NotImplementedError(f"prefixscope supports sqlite and postgresql, not {name}")
