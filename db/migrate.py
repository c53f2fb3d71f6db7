"""Running the Alembic migrations programmatically: the only way prefixscope's schema is created or changed.

The `migrations` package is located through its import path, so this works from a source checkout and from an
installed package alike, without an `alembic.ini`.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from db.config import sqlite_path
from db.engine import create_sync_engine_for
from db.errors import DatabaseConfigError

# One "setup plugin" INFO line per Alembic plugin, and two lines naming the dialect, open every migration otherwise;
# the "Running upgrade" lines, which say that something changed, stay.
logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
_QUIET_PREFIXES = ("Context impl ", "Will assume ")
logging.getLogger("alembic.runtime.migration").addFilter(
    lambda record: not str(record.msg).startswith(_QUIET_PREFIXES)
)


def migrations_dir() -> Path:
    """The directory holding `env.py` and `versions/`."""
    import migrations

    return Path(migrations.__file__).resolve().parent


def alembic_config(url: str | None = None) -> Config:
    """An Alembic `Config` for prefixscope's migrations, with `sqlalchemy.url` set when `url` is given."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    if url is not None:
        # ConfigParser treats % as interpolation; URLs may carry percent-encoded passwords.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def _run(url: str, action: str, revision: str) -> None:
    path = sqlite_path(url)
    if path is not None and action == "upgrade":
        # Creating the schema is the natural moment to create the SQLite file's directory.
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file in the way, no permission: say so in one line
            raise DatabaseConfigError(
                f"cannot create the directory {path.parent} for the database {path}: {exc.strerror}"
            ) from exc
    config = alembic_config(url)
    engine = create_sync_engine_for(url)
    try:
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            getattr(command, action)(config, revision)
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at `url` (any accepted spelling, async URLs included) up to `revision`."""
    _run(url, "upgrade", revision)


def downgrade(url: str, revision: str) -> None:
    """Migrate the database at `url` down to `revision` (`"base"` drops every prefixscope table)."""
    _run(url, "downgrade", revision)


async def upgrade_async(url: str, revision: str = "head") -> None:
    """`upgrade` from async code (the gateway's start-up), in a worker thread so the event loop keeps running."""
    await asyncio.to_thread(upgrade, url, revision)


def new_revision(url: str, message: str, autogenerate: bool = True) -> None:
    """Write a new migration script into `migrations/versions` (for developers, from a source checkout).

    With `autogenerate`, the script holds the difference between the models and the database at `url`, which
    should be migrated to head first. Review it before committing: autogenerate misses renames and data moves.
    """
    config = alembic_config(url)
    engine = create_sync_engine_for(url)
    try:
        with engine.connect() as conn:
            config.attributes["connection"] = conn
            command.revision(config, message=message, autogenerate=autogenerate)
    finally:
        engine.dispose()


def head_revision() -> str:
    """The newest revision in `migrations/versions`."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:  # pragma: no cover - the package always ships at least one revision
        raise RuntimeError("no migrations found")
    return head


def current_revision(url: str) -> str | None:
    """The revision the database at `url` is at, or None for an empty database."""
    engine = create_sync_engine_for(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def is_current(url: str) -> bool:
    """Whether the database at `url` is migrated to the newest revision (programs that require it check this)."""
    return current_revision(url) == head_revision()
