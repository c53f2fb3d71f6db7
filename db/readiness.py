"""Checks that read-only commands run before they touch a database, so reading never creates one.

Connecting to a SQLite URL creates an empty file; a command such as `prefixscope stats` run from the wrong place or
before the gateway ever started would then fail on a missing table and leave the empty file behind. `require_schema`
refuses first, naming the database and the command that creates it.
"""

from __future__ import annotations

from db.config import sqlite_path
from db.errors import DatabaseError
from prefixscope.invocation import typed_command


def how_to_create() -> str:
    """The commands that create the database, as they can be typed here (`.venv/bin/prefixscope` off PATH)."""
    command = typed_command()
    return f"start the gateway (`{command} up` or `{command} gateway`) or run `{command} db upgrade`"


class DatabaseNotReady(DatabaseError):
    """The database does not exist yet, or its schema is missing or older than this version's."""


def _shown(url: str) -> str:
    path = sqlite_path(url)
    if path is not None:
        return str(path.resolve())
    return url.split("@")[-1]


def _url_option(url: str, explicit: bool) -> str:
    return f" --database-url {url}" if explicit else ""


def require_schema(url: str, explicit: bool = False) -> None:
    """Raise `DatabaseNotReady` unless the database at `url` exists and is migrated to the newest revision.

    `explicit` says the URL came from `--database-url`, so the suggested command repeats it.
    """
    path = sqlite_path(url)
    if path is not None and not path.exists():
        if explicit:
            raise DatabaseNotReady(
                f"no database at {path.resolve()}: run `{typed_command()} db upgrade --database-url {url}`"
            )
        raise DatabaseNotReady(
            f"no database at {path.resolve()}: {how_to_create()}, "
            "or point --database-url / $PREFIXSCOPE_DATABASE_URL at your database"
        )
    from db.migrate import current_revision, head_revision

    revision = current_revision(url)
    if revision is None:
        raise DatabaseNotReady(
            f"the database at {_shown(url)} has no prefixscope tables: "
            f"run `{typed_command()} db upgrade{_url_option(url, explicit)}`"
        )
    if revision != head_revision():
        raise DatabaseNotReady(
            f"the database at {_shown(url)} is at schema revision {revision}, this version needs "
            f"{head_revision()}: run `{typed_command()} db upgrade{_url_option(url, explicit)}`"
        )
