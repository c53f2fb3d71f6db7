"""The exception hierarchy of the `db` package."""

from __future__ import annotations


class DatabaseError(Exception):
    """Base class for errors raised by `db`."""


class DatabaseConfigError(DatabaseError, ValueError):
    """A database URL or setting that prefixscope cannot use."""


class UnknownTenantError(DatabaseError, LookupError):
    """A tenant name that has no row in `tenants`."""
