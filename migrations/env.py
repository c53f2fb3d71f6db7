"""Alembic environment: runs on SQLite and PostgreSQL, from `db.migrate` or the `alembic` command.

`db.migrate` passes an open connection in `config.attributes["connection"]`. The `alembic` command line instead
reads the URL from `sqlalchemy.url` in its config or `$PREFIXSCOPE_DATABASE_URL`; an async URL is swapped for the
matching sync driver, since migrations run synchronously.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection

from db.config import database_url_from_env, sync_url
from db.engine import create_sync_engine_for
from db.models import Base

config = context.config
target_metadata = Base.metadata


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead, and is a no-op cost on PostgreSQL.
        render_as_batch=True,
        compare_type=True,
        **kwargs,
    )


def _url() -> str:
    return database_url_from_env(config.get_main_option("sqlalchemy.url") or None)


def run_migrations_offline() -> None:
    """Emit SQL to stdout instead of running it (`alembic upgrade head --sql`)."""
    _configure(url=sync_url(_url()), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _run_on(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run against a live database, on the caller's connection when one was given."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    engine = create_sync_engine_for(_url())
    try:
        with engine.connect() as conn:
            _run_on(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
