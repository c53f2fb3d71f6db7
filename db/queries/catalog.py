"""What exists in the data: tenant, model and upstream names, for filters and drop-downs."""

from __future__ import annotations

from sqlalchemy import select, union

from db.models import Tenant, table_of
from db.queries.totals import ROLLUPS, Reader


def _distinct(conn: Reader, column_name: str) -> list[str]:
    column = ROLLUPS.c[column_name]
    return sorted(conn.scalars(select(column).distinct()))


def tenants(conn: Reader) -> list[str]:
    """Every tenant name: those with recorded requests and those registered (perhaps without traffic yet)."""
    names = union(select(ROLLUPS.c.tenant.label("name")).distinct(), select(table_of(Tenant).c.name))
    return sorted(conn.scalars(select(names.subquery().c.name)))


def models(conn: Reader) -> list[str]:
    """Every model name with recorded requests."""
    return _distinct(conn, "model")


def upstreams(conn: Reader) -> list[str]:
    """Every upstream with recorded requests."""
    return _distinct(conn, "upstream")
