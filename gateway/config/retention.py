"""A tenant's retention settings: the class sent when a request names none and the longest class a request may get.

Read from a `[tenant_defaults]` or `[tenants.NAME]` table (see `gateway.retention` for how a request's class is
chosen)::

    [tenant_defaults]
    max_cache_retention = "1h"        # 5m | 1h | persistent (the default: no ceiling)

    [tenants.acme]
    cache_retention = "1h"            # sent when the request names no class
    max_cache_retention = "persistent"
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from db.records import RETENTION_CLASSES
from gateway.errors import ConfigError

LONGEST_CLASS = RETENTION_CLASSES[-1]


def retention_rank(retention: str) -> int:
    """Position of `retention` in `RETENTION_CLASSES` (shortest first). Raises ValueError for an unknown class."""
    return RETENTION_CLASSES.index(retention)


def capped(retention: str | None, maximum: str) -> str | None:
    """`retention` lowered to `maximum` when it is longer (None stays None)."""
    if retention is None or retention_rank(retention) <= retention_rank(maximum):
        return retention
    return maximum


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """A tenant's retention settings: the class sent when a request names none (None: send none) and the longest
    class a request may get."""

    default: str | None = None
    maximum: str = LONGEST_CLASS

    def effective(self, requested: str | None) -> str | None:
        """The class to send for a request that asked for `requested` (None: it asked for nothing)."""
        return capped(requested if requested is not None else self.default, self.maximum)


def _config_class(values: Mapping[str, Any], key: str, fallback: str | None) -> str | None:
    value = values.get(key, fallback)
    if value is not None and value not in RETENTION_CLASSES:
        raise ConfigError(f"{key} must be one of {list(RETENTION_CLASSES)}, not {value!r}")
    return value


def parse_retention(values: dict[str, Any], base: RetentionPolicy) -> RetentionPolicy:
    """`cache_retention` and `max_cache_retention` of a tenant table (popped from `values`) over `base`. Raises
    `ConfigError` for an unknown class or a default longer than the maximum."""
    default = _config_class(values, "cache_retention", base.default)
    maximum = _config_class(values, "max_cache_retention", base.maximum)
    values.pop("cache_retention", None)
    values.pop("max_cache_retention", None)
    assert maximum is not None
    if default is not None and retention_rank(default) > retention_rank(maximum):
        raise ConfigError(
            f"cache_retention = {default!r} is longer than max_cache_retention = {maximum!r}; lower the default or "
            "raise the maximum"
        )
    return RetentionPolicy(default, maximum)
