"""Engines and sessions for one database URL, sync (CLI, dashboard, Alembic) and async (gateway).

SQLite connections get WAL mode (readers such as the dashboard never block the gateway's writer, and the writer
never blocks them), a busy timeout (two writers wait for each other instead of failing at once) and foreign keys.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, sessionmaker

from db.config import async_url, backend_of, sync_url

SQLITE_BUSY_TIMEOUT_MS = 10_000
# How long a connection attempt to PostgreSQL may take before the writer gives up and spills to disk.
POSTGRES_CONNECT_TIMEOUT_S = 5

T = TypeVar("T")


def _sqlite_pragmas(busy_timeout_ms: int) -> Callable[[Any, Any], None]:
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            # With WAL, NORMAL stays consistent across crashes and only risks the last commits on power loss.
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    return on_connect


def _connect_args(url: str, is_async: bool) -> dict[str, Any]:
    if backend_of(url) == "sqlite":
        return {}
    if is_async and url.startswith("postgresql+asyncpg"):
        return {"timeout": POSTGRES_CONNECT_TIMEOUT_S}
    return {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S}


def create_sync_engine_for(url: str, busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS, **kwargs: Any) -> Engine:
    """A blocking engine for `url` (any accepted spelling); extra keyword arguments go to `create_engine`.

    `busy_timeout_ms` is how long a SQLite connection waits for another writer's lock before failing.
    """
    target = sync_url(url)
    kwargs.setdefault("connect_args", _connect_args(target, is_async=False))
    engine = create_engine(target, **kwargs)
    if backend_of(target) == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas(busy_timeout_ms))
    return engine


def create_async_engine_for(url: str, busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS, **kwargs: Any) -> AsyncEngine:
    """An asyncio engine for `url` (any accepted spelling); extra keyword arguments go to `create_async_engine`.

    `busy_timeout_ms` is how long a SQLite connection waits for another writer's lock before failing.
    """
    target = async_url(url)
    kwargs.setdefault("connect_args", _connect_args(target, is_async=True))
    if backend_of(target) == "postgresql":
        # Drop connections the server closed while idle instead of failing the next batch on them.
        kwargs.setdefault("pool_pre_ping", True)
    engine = create_async_engine(target, **kwargs)
    if backend_of(target) == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas(busy_timeout_ms))
    return engine


def sync_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions on a sync engine; objects stay usable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


def async_session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions on an async engine; objects stay usable after commit (no lazy loads after the fact)."""
    return async_sessionmaker(engine, expire_on_commit=False)


def run_in_transaction(bind: Engine | Connection | Session, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call `fn(connection, *args, **kwargs)`.

    Given an Engine, a transaction is opened and committed around the call; given a Connection or Session, the
    caller owns the transaction and `fn` runs inside it.
    """
    if isinstance(bind, Engine):
        with bind.begin() as conn:
            return fn(conn, *args, **kwargs)
    if isinstance(bind, Session):
        return fn(bind.connection(), *args, **kwargs)
    return fn(bind, *args, **kwargs)


async def run_in_transaction_async(
    bind: AsyncEngine | AsyncConnection | AsyncSession, fn: Callable[..., T], *args: Any, **kwargs: Any
) -> T:
    """The async counterpart of `run_in_transaction`: `fn` is a sync function of a Connection, run via `run_sync`."""
    if isinstance(bind, AsyncEngine):
        async with bind.begin() as conn:
            return await conn.run_sync(fn, *args, **kwargs)
    if isinstance(bind, AsyncSession):
        conn = await bind.connection()
        return await conn.run_sync(fn, *args, **kwargs)
    return await bind.run_sync(fn, *args, **kwargs)


async def run_query(engine: AsyncEngine, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a sync read-side function of `db.queries` on an async engine: `await run_query(engine, stats, ...)`."""
    async with engine.connect() as conn:
        return await conn.run_sync(fn, *args, **kwargs)


async def run_write(engine: AsyncEngine, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a sync function that writes (e.g. from `db.keys`) in one committed transaction on an async engine."""
    async with engine.begin() as conn:
        return await conn.run_sync(fn, *args, **kwargs)
