"""The `[responses]` section of `prefixscope.toml`: how much the gateway keeps for `previous_response_id` and `GET`.

    [responses]
    store_ttl_s = 3600                      # a stored response is forgotten this long after it was last used
    store_max_entries = 10000               # all tenants together
    store_max_entries_per_tenant = 1000     # one tenant cannot push the others' responses out
    store_max_bytes = 67108864              # the stored conversations' JSON, all tenants together

The store lives in the gateway's memory only (never in the database): a gateway restart forgets it, and a
`previous_response_id` it no longer knows is a 404 naming that field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.errors import ConfigError


@dataclass(frozen=True)
class ResponsesSettings:
    store_ttl_s: float = 3600.0
    store_max_entries: int = 10_000
    store_max_entries_per_tenant: int = 1000
    store_max_bytes: int = 64 * 1024 * 1024


def parse_responses_settings(values: Mapping[str, Any]) -> ResponsesSettings:
    """Build the settings from the `[responses]` table; raises `ConfigError` on unknown keys or bad values."""
    values = dict(values)
    base = ResponsesSettings()
    parsed: dict[str, Any] = {}
    for name in ("store_ttl_s", "store_max_entries", "store_max_entries_per_tenant", "store_max_bytes"):
        value = values.pop(name, getattr(base, name))
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(f"[responses] {name} must be a positive number, not {value!r}")
        parsed[name] = float(value) if name == "store_ttl_s" else int(value)
    if values:
        raise ConfigError(f"unknown [responses] keys: {sorted(values)}")
    return ResponsesSettings(**parsed)
