"""What exists in the data: tenant, model and upstream names, for filters and drop-downs, and which tenant each
engine cache namespace belongs to."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select, union

from db.models import NamespaceTenant, Tenant, table_of
from db.queries.totals import ROLLUPS, Reader
from db.timeutil import as_utc


def _distinct(conn: Reader, column_name: str) -> list[str]:
    column = ROLLUPS.c[column_name]
    return sorted(conn.scalars(select(column).distinct()))


def tenants(conn: Reader) -> list[str]:
    """Every tenant name: those with recorded requests and those registered (perhaps without traffic yet)."""
    names = union(select(ROLLUPS.c.tenant.label("name")).distinct(), select(table_of(Tenant).c.name))
    return sorted(conn.scalars(select(names.subquery().c.name)))


def namespace_tenants(conn: Reader) -> dict[str, str]:
    """Engine cache namespace label -> tenant name, as recorded by the gateway with each tenant's requests."""
    table = table_of(NamespaceTenant)
    return {row.namespace_label: row.tenant for row in conn.execute(select(table.c.namespace_label, table.c.tenant))}


def first_seen(conn: Reader) -> datetime | None:
    """The start of the oldest hour with recorded requests, or None without any."""
    value = conn.scalar(select(func.min(ROLLUPS.c.bucket_start)))
    return None if value is None else as_utc(value)


def models(conn: Reader) -> list[str]:
    """Every model name with recorded requests."""
    return _distinct(conn, "model")


def upstreams(conn: Reader) -> list[str]:
    """Every upstream with recorded requests."""
    return _distinct(conn, "upstream")
