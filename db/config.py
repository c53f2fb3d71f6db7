"""Database URLs: where the default comes from and how one URL is turned into what each user needs.

The gateway's writer and stats API use an async driver (aiosqlite, asyncpg); Alembic, the CLI and the dashboard use
a sync one (pysqlite, psycopg). Users configure a single URL in any of the accepted spellings, and each program asks
for the flavour it needs with `async_url` or `sync_url`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from db.errors import DatabaseConfigError

ENV_DATABASE_URL = "PREFIXSCOPE_DATABASE_URL"


Backend = Literal["sqlite", "postgresql"]

_SQLITE_DRIVERS = {"sqlite", "sqlite+pysqlite", "sqlite+aiosqlite"}
_POSTGRES_DRIVERS = {
    "postgres",
    "postgresql",
    "postgresql+asyncpg",
    "postgresql+psycopg",
    "postgresql+psycopg_async",
    "postgresql+psycopg2",
}


def default_database_url() -> str:
    """A SQLite file in the per-user state directory (`prefixscope.paths`): the embedded single-gateway set-up
    needs no server and no configuration, and finds the same database from any working directory."""
    from prefixscope.paths import default_database_url as in_state_dir

    return in_state_dir()


def database_url_from_env(explicit: str | None = None) -> str:
    """The URL to use: `explicit` if given, else `$PREFIXSCOPE_DATABASE_URL`, else `default_database_url()`.

    The URL is checked (a `DatabaseConfigError` names what is wrong) but kept as written; use `async_url` or
    `sync_url` to get a driver-specific form.
    """
    url = explicit or os.environ.get(ENV_DATABASE_URL) or default_database_url()
    backend_of(url)
    return url


def shown_url(url: str) -> str:
    """`url` fit to print or log: any user name and password are replaced by `***`."""
    return re.sub(r"//[^@/]*@", "//***@", url)


def _scheme(url: str) -> str:
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise DatabaseConfigError(f"not a database URL: {url!r} (expected e.g. sqlite:///path.db or postgresql://...)")
    return scheme.lower()


def backend_of(url: str) -> Backend:
    """`"sqlite"` or `"postgresql"`; raises `DatabaseConfigError` for any other scheme."""
    scheme = _scheme(url)
    if scheme in _SQLITE_DRIVERS:
        return "sqlite"
    if scheme in _POSTGRES_DRIVERS:
        return "postgresql"
    accepted = ", ".join(sorted(_SQLITE_DRIVERS | _POSTGRES_DRIVERS))
    raise DatabaseConfigError(f"unsupported database URL scheme {scheme!r}; accepted: {accepted}")


def _with_scheme(url: str, scheme: str) -> str:
    return scheme + "://" + url.partition("://")[2]


def async_url(url: str) -> str:
    """The URL with an asyncio driver: aiosqlite for SQLite, asyncpg unless psycopg was asked for explicitly."""
    scheme = _scheme(url)
    if backend_of(url) == "sqlite":
        return _with_scheme(url, "sqlite+aiosqlite")
    if scheme in ("postgresql+psycopg", "postgresql+psycopg_async"):
        return _with_scheme(url, "postgresql+psycopg")
    return _with_scheme(url, "postgresql+asyncpg")


def sync_url(url: str) -> str:
    """The URL with a blocking driver: pysqlite for SQLite, psycopg 3 for PostgreSQL."""
    if backend_of(url) == "sqlite":
        return _with_scheme(url, "sqlite")
    return _with_scheme(url, "postgresql+psycopg")


def sqlite_path(url: str) -> Path | None:
    """The database file of a SQLite URL, or None for PostgreSQL and in-memory SQLite."""
    if backend_of(url) != "sqlite":
        return None
    rest = url.partition("://")[2]
    # sqlite:///relative.db and sqlite:////absolute.db: what follows the third slash is the path.
    path = rest[1:] if rest.startswith("/") else rest
    path = path.split("?", 1)[0]
    if path in ("", ":memory:") or path.startswith("file:"):
        return None
    return Path(path)
