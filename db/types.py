"""Column types that behave the same on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from db.timeutil import as_utc


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always returned timezone-aware.

    PostgreSQL keeps `timestamptz`; SQLite has no zone, so values are converted to UTC and stored naive, which keeps
    its text ordering equal to time ordering. Naive inputs are taken to be UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        utc = as_utc(value)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else as_utc(value)


def portable_json() -> Any:
    """JSON everywhere, stored as JSONB on PostgreSQL (smaller, and indexable should that ever be needed)."""
    return JSON().with_variant(JSONB(), "postgresql")
