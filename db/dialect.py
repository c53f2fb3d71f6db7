"""Dialect-specific statement builders, kept in one place."""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Connection, Integer, Table, cast, extract, func
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session


def dialect_name(bind: Connection | Session) -> str:
    """`"sqlite"` or `"postgresql"` for a Connection or a Session."""
    if isinstance(bind, Session):
        return bind.get_bind().dialect.name
    return bind.dialect.name


def upsert_insert(conn: Connection | Session, table: Table) -> Any:
    """An INSERT for `table` that supports `on_conflict_do_update/_nothing` on this connection's dialect."""
    name = dialect_name(conn)
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise NotImplementedError(f"prefixscope supports sqlite and postgresql, not {name}")


def bucket_index(conn: Connection | Session, column: Any, size_s: int, offset_s: int = 0) -> Any:
    """SQL for `floor((epoch seconds of column - offset_s) / size_s)`, for grouping timestamps into buckets.

    Used to aggregate hourly rollups into days and weeks in the database rather than in Python.
    """
    name = dialect_name(conn)
    if name == "postgresql":
        seconds = cast(extract("epoch", column), BigInteger)
    elif name == "sqlite":
        # Timestamps are stored as UTC text, which strftime('%s') reads as UTC.
        seconds = cast(func.strftime("%s", column), Integer)
    else:
        raise NotImplementedError(f"prefixscope supports sqlite and postgresql, not {name}")
    return (seconds - offset_s) // size_s


def least(conn: Connection | Session, left: Any, right: Any) -> Any:
    """SQL for the smaller of two values (`min(a, b)` on SQLite, `LEAST(a, b)` on PostgreSQL)."""
    return func.min(left, right) if dialect_name(conn) == "sqlite" else func.least(left, right)


def greatest(conn: Connection | Session, left: Any, right: Any) -> Any:
    """SQL for the larger of two values (`max(a, b)` on SQLite, `GREATEST(a, b)` on PostgreSQL)."""
    return func.max(left, right) if dialect_name(conn) == "sqlite" else func.greatest(left, right)
