"""Tenants and their settings.

Every function takes a sync `Engine` (a transaction is opened and committed), `Connection` or `Session` (the
caller's transaction is used); the `*_async` variants take the async counterparts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from db.dialect import upsert_insert
from db.engine import run_in_transaction, run_in_transaction_async
from db.errors import UnknownTenantError
from db.models import Tenant, table_of
from db.records import TENANT_NAME_MAX, UNAUTHENTICATED_TENANT
from db.timeutil import utc_now

SyncBind = Engine | Connection | Session
AsyncBind = AsyncEngine | AsyncConnection | AsyncSession
TENANTS = table_of(Tenant)


@dataclass(frozen=True)
class TenantInfo:
    """A tenant as stored."""

    id: int
    name: str
    settings: dict[str, Any]
    created_at: datetime


def _info(row: Any) -> TenantInfo:
    return TenantInfo(id=row.id, name=row.name, settings=dict(row.settings or {}), created_at=row.created_at)


def validate_tenant_name(name: str) -> str:
    """The name, stripped; raises ValueError if it is empty, too long or the reserved `UNAUTHENTICATED_TENANT`."""
    cleaned = name.strip()
    if not cleaned:
        raise ValueError("a tenant name must not be empty")
    if cleaned == UNAUTHENTICATED_TENANT:
        raise ValueError(f"the tenant name {UNAUTHENTICATED_TENANT!r} is reserved for requests refused before a key")
    if len(cleaned) > TENANT_NAME_MAX:
        raise ValueError(f"a tenant name must be at most {TENANT_NAME_MAX} characters")
    return cleaned


def _get(conn: Connection, name: str) -> TenantInfo | None:
    row = conn.execute(select(TENANTS).where(TENANTS.c.name == name)).first()
    return None if row is None else _info(row)


def _require(conn: Connection, name: str) -> TenantInfo:
    info = _get(conn, name)
    if info is None:
        raise UnknownTenantError(f"no tenant named {name!r}")
    return info


def _ensure(conn: Connection, name: str, settings: dict[str, Any] | None) -> TenantInfo:
    name = validate_tenant_name(name)
    existing = _get(conn, name)
    if existing is not None:
        return existing
    # ON CONFLICT DO NOTHING: two processes creating the same tenant at once both end up with the one row.
    stmt = upsert_insert(conn, TENANTS).values(name=name, settings=settings or {}, created_at=utc_now())
    conn.execute(stmt.on_conflict_do_nothing(index_elements=["name"]))
    return _require(conn, name)


def _set_settings(conn: Connection, name: str, settings: dict[str, Any]) -> TenantInfo:
    result = conn.execute(update(TENANTS).where(TENANTS.c.name == name).values(settings=settings))
    if result.rowcount == 0:
        raise UnknownTenantError(f"no tenant named {name!r}")
    return _require(conn, name)


def _load(conn: Connection) -> list[TenantInfo]:
    return [_info(row) for row in conn.execute(select(TENANTS).order_by(TENANTS.c.name))]


def ensure_tenant(bind: SyncBind, name: str, settings: dict[str, Any] | None = None) -> TenantInfo:
    """The tenant called `name`, created (with `settings`) if it does not exist; existing settings are kept."""
    return run_in_transaction(bind, _ensure, name, settings)


def get_tenant(bind: SyncBind, name: str) -> TenantInfo | None:
    """The tenant called `name`, or None."""
    return run_in_transaction(bind, _get, name)


def set_tenant_settings(bind: SyncBind, name: str, settings: dict[str, Any]) -> TenantInfo:
    """Replace a tenant's settings; raises `UnknownTenantError` if there is no such tenant."""
    return run_in_transaction(bind, _set_settings, name, settings)


def load_tenants(bind: SyncBind) -> list[TenantInfo]:
    """Every tenant, by name."""
    return run_in_transaction(bind, _load)


async def ensure_tenant_async(bind: AsyncBind, name: str, settings: dict[str, Any] | None = None) -> TenantInfo:
    """`ensure_tenant` on an async engine, connection or session."""
    return await run_in_transaction_async(bind, _ensure, name, settings)


async def get_tenant_async(bind: AsyncBind, name: str) -> TenantInfo | None:
    """`get_tenant` on an async engine, connection or session."""
    return await run_in_transaction_async(bind, _get, name)


async def set_tenant_settings_async(bind: AsyncBind, name: str, settings: dict[str, Any]) -> TenantInfo:
    """`set_tenant_settings` on an async engine, connection or session."""
    return await run_in_transaction_async(bind, _set_settings, name, settings)


async def load_tenants_async(bind: AsyncBind) -> list[TenantInfo]:
    """`load_tenants` on an async engine, connection or session."""
    return await run_in_transaction_async(bind, _load)
