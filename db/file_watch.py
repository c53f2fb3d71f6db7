"""Noticing that a SQLite database file was deleted or replaced under a running process.

An open SQLite connection keeps writing into the file it opened, even after that file was deleted (the inode lives
on, unreachable) or another file was moved to its path. `DatabaseFileWatch` remembers the identity (device and inode)
of the file at the path and says when the path no longer names it, so the writer can reopen and migrate the database
at the path instead of counting rows into a file nobody can read.
"""

from __future__ import annotations

import os
from pathlib import Path

from db.config import backend_of, sqlite_path


def file_identity(path: Path) -> tuple[int, int] | None:
    """`(st_dev, st_ino)` of the file at `path`, or None when there is none."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return info.st_dev, info.st_ino


class DatabaseFileWatch:
    """Watches the file behind a SQLite URL (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._identity: tuple[int, int] | None = None
        self._reported: tuple[tuple[int, int] | None] | None = None  # the replacement already reported, if any

    @classmethod
    def for_url(cls, url: str) -> DatabaseFileWatch | None:
        """A watch for a file-backed SQLite URL; None for PostgreSQL and in-memory SQLite."""
        if backend_of(url) != "sqlite":
            return None
        path = sqlite_path(url)
        return None if path is None else cls(Path(path))

    def replaced(self) -> bool:
        """Whether the path is missing or names another file than the one first seen there (False until a file was
        seen: a database that was never created is unavailable, not replaced)."""
        current = file_identity(self.path)
        if self._identity is None:
            self._identity = current
            return False
        return current != self._identity

    def reset(self) -> None:
        """Take the file now at the path as the database file."""
        self._identity = file_identity(self.path)
        self._reported = None

    def first_report(self) -> bool:
        """Whether the replacement now at the path (a file, or none) is one not reported yet: True once per event,
        however many times recreating the database there fails (a file that is no database, say) until `reset`."""
        current = (file_identity(self.path),)
        if current == self._reported:
            return False
        self._reported = current
        return True

    def remove_stale_companions(self) -> None:
        """Remove the `-wal` and `-shm` files at the path once our connections to the old file are closed.

        They belong to the old file (its write-ahead log can still hold committed pages): left there, SQLite would
        apply them to the new file at the path. A file moved or copied into place comes without them.
        """
        for suffix in ("-wal", "-shm"):
            companion = self.path.with_name(self.path.name + suffix)
            try:
                companion.unlink()
            except FileNotFoundError:
                pass
